"""Start the runtime: check the model directory, start the engine, serve HTTP, warm up, then say it is ready.

Start-up problems a user can fix (bad model path, unreadable tokenizer, pools that cannot hold one request)
are raised as `StartupError` with one line naming the flag to change; `python -m runtime` prints it, exits 2.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from dataclasses import fields
from typing import Any

from hybridshared.flags.fields import engine_targets
from hybridshared.flags.runtime_args import RuntimeArgs
from runtime.core.config import EngineArgs, engine_args, read_hf_config
from runtime.engine.api import EngineClient
from runtime.server.context import ServerContext
from runtime.server.structured import GrammarBackendUnavailable, grammar_backend_options, load_grammar_backend
from runtime.server.tokenizer import ServerTokenizer, TokenizerLoadError

logger = logging.getLogger("runtime.server")

READY_MESSAGE = "The server is fired up and ready to roll!"
ENGINE_WATCH_INTERVAL_S = 0.2
WARMUP_TEXT = "The capital city of France is"  # SGLang's warm-up prompt
WARMUP_TIMEOUT_S = 600.0


class StartupError(Exception):
    pass


def _engine_args(args: RuntimeArgs, device: str) -> EngineArgs:
    """The engine's options, derived from the flags' metadata (`engine_args`), on the resolved device."""
    missing = set(engine_targets(RuntimeArgs).values()) - {f.name for f in fields(EngineArgs)}
    if missing:  # a flag the engine stopped taking must fail loudly, never be dropped silently
        raise StartupError(f"the engine does not take these options: {', '.join(sorted(missing))}")
    return engine_args(args, device)


def _resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise StartupError("--device cuda: torch sees no CUDA device here; use --device cpu (or auto)")
    return requested


def _start_engine(args: RuntimeArgs, engine_args: EngineArgs, grammar: dict[str, Any] | None) -> EngineClient:
    """The engine, on a thread of this process or (--engine-process) in a process of its own."""
    try:
        if args.engine_process:
            from runtime.engine.engine_process import ProcessEngineClient
            from runtime.engine.wire import EngineInit

            init = EngineInit(engine_args, args.num_threads, args.random_seed, args.log_level, grammar)
            return ProcessEngineClient.start(init)
        from runtime.engine.engine_thread import ThreadedEngineClient

        engine = ThreadedEngineClient.start(engine_args)
    except (ValueError, OSError, RuntimeError, KeyError) as e:
        logger.debug("engine start-up failed", exc_info=True)
        raise StartupError(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__) from None
    if args.disaggregation_mode == "null":
        return engine
    from runtime.pd.setup import PDSetupError, wrap_client

    try:
        return wrap_client(engine, args)
    except PDSetupError as e:
        engine.shutdown()
        raise StartupError(str(e)) from None


def start_context(args: RuntimeArgs) -> ServerContext:
    """Everything before HTTP: tokenizer, engine (model + pools). Raises StartupError for fixable problems."""
    from runtime.preflight import PreflightError, preflight

    try:
        preflight(args)  # what the engine would refuse, before anything loads
    except PreflightError as e:
        raise StartupError(str(e)) from None
    try:
        tokenizer = ServerTokenizer.load(args.resolved_tokenizer_path)
    except TokenizerLoadError as e:
        raise StartupError(str(e)) from None
    import torch

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    if args.random_seed is not None:
        torch.manual_seed(args.random_seed)
    hf_config = read_hf_config(args.model_path)
    vocab = hf_config.get("vocab_size")
    vocab_size = int(vocab) if isinstance(vocab, int) else tokenizer.vocab_size
    device = _resolve_device(args.device)
    client = _start_engine(args, _engine_args(args, device), grammar_backend_options(args, vocab_size, hf_config))
    stats = client.stats()
    _ = tokenizer.max_token_bytes  # the prompt pre-check's bound, computed once before serving
    try:
        grammar_backend = load_grammar_backend(args, vocab_size, hf_config)
    except (GrammarBackendUnavailable, ValueError, OSError) as e:
        client.shutdown()
        raise StartupError(str(e)) from None
    return ServerContext(
        args=args,
        client=client,
        tokenizer=tokenizer,
        hf_config=hf_config,
        context_len=stats.context_len,
        vocab_size=vocab_size,
        grammar_backend=grammar_backend,
    )


def defer_to_the_engine_on_wakeup() -> bool:
    """Make the calling thread (the event loop's; threads it starts later inherit it) SCHED_BATCH on Linux.

    Why: the engine thread wakes the event loop once per step, and the kernel then often runs the woken loop
    thread at once on the engine's own core, preempting the engine mid-step. A SCHED_BATCH thread has the same
    CPU share but never preempts on wake-up: it runs on an idle core, or at the next tick. Measured on the
    peer model (docs/performance.md, "Runtime hot path"): the engine thread's involuntary context switches per
    token fell 22% single-stream and 14% at 8 concurrent. True when set."""
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None or not hasattr(os, "SCHED_BATCH"):
        return False
    try:
        setter(0, os.SCHED_BATCH, os.sched_param(0))  # pid 0: this thread only (Linux policies are per thread)
    except OSError as e:  # a seccomp/container policy may refuse it: nothing else depends on it
        logger.debug("could not make the event loop thread SCHED_BATCH: %s", e)
        return False
    return True


async def post_json(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """One HTTP/1.1 POST over a fresh loopback connection: (status, raw response body).

    Why not httpx: importing it (and through it rich, pygments, click, trio) and its client's TLS context kept
    ~10 MB resident in a server that only ever sends this one request (served real-size models, idle VmRSS)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        lines = [
            f"POST {path} HTTP/1.1",
            f"Host: {authority}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        response = await reader.read()  # to EOF: the server closes after answering a `Connection: close`
    finally:
        writer.close()
        await writer.wait_closed()
    status_line, _, rest = response.partition(b"\r\n")
    parts = status_line.split()
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return status, rest.partition(b"\r\n\r\n")[2]


async def _warmup_request(args: RuntimeArgs) -> None:
    """One greedy /generate through the server's own HTTP stack; raises with the answer when it is not 200."""
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    payload = {"text": WARMUP_TEXT, "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
    status, body = await asyncio.wait_for(
        post_json(host, args.port, "/generate", json.dumps(payload).encode(), headers), WARMUP_TIMEOUT_S
    )
    if status != 200:
        raise RuntimeError(f"warm-up request answered {status}: {body.decode(errors='replace')[:300]}")


def serve(ctx: ServerContext) -> int:
    """Run the HTTP server until SIGINT/SIGTERM; returns the process exit code."""
    import anyio
    import uvicorn

    from runtime.server.http_server import build_app

    args = ctx.args
    failed: list[str] = []
    server: uvicorn.Server | None = None

    async def warmup() -> None:
        assert server is not None
        while not server.started:
            await asyncio.sleep(0.05)
        ctx.client.hold_idle_work(True)
        # Streamed responses run on anyio (starlette), which imports its asyncio backend on first use: done here,
        # or the first streaming client's TTFT pays the import (httpx's client used to do it, unasked).
        await anyio.sleep(0)
        try:
            await _warmup_request(args)
        except Exception as e:
            failed.append(str(e))
            logger.error("Initialization failed. warmup error: %s", e)
            server.should_exit = True
            return
        # The warm-up prompt's cached state would hold a state slot (tens of MB for a real-size model) that no
        # client will match; flushed, the slot goes back on top of the free list for the next request to reuse.
        await asyncio.to_thread(ctx.client.flush_cache)
        ctx.client.hold_idle_work(False)
        ctx.ready = True
        logger.info(READY_MESSAGE)

    async def watchdog() -> None:
        """A dead engine loop cannot serve again: fail health (it does by itself), then exit non-zero so a
        supervisor (systemd, Kubernetes, hybridctl launch) restarts the server instead of it hanging."""
        while True:
            await asyncio.sleep(ENGINE_WATCH_INTERVAL_S)
            failure = ctx.engine_failure()
            if failure is not None:
                failed.append(f"engine loop died: {failure}")
                logger.critical("The engine loop died (%s); shutting down with exit code 1.", failure)
                ctx.ready = False
                assert server is not None
                server.should_exit = True
                return

    config = uvicorn.Config(
        build_app(ctx, warmup, watchdog),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.log_requests,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=5,
    )

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            # Open streams would run until uvicorn's graceful-shutdown timeout cancels them mid-write: abort
            # them first so each ends with its final chunk and [DONE], and the connections close cleanly.
            aborted = ctx.engine.abort_all()
            if aborted:
                logger.info("Shutting down: aborted %d unfinished request(s)", aborted)
            await super().shutdown(sockets)

    server = _Server(config)
    # uvicorn re-raises the SIGINT/SIGTERM it handled once its graceful shutdown is done; with the default
    # handlers that would kill the process before the engine thread is stopped, so they become no-ops here.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    defer_to_the_engine_on_wakeup()  # after the engine thread and its OpenMP pool exist: they keep their policy
    try:
        server.run()
    finally:
        ctx.client.shutdown()
    if failed:
        return 1
    return 0 if server.started else 1
