"""The HTTP app: SGLang 0.5.23's native and OpenAI routes, API-key auth, and the warm-up before ready."""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.core.requests import GenerateRequest, SamplingParams
from runtime.server import generate_api, openai_api
from runtime.server.context import ServerContext, error_response
from runtime.server.engine_bridge import RequestGroup
from runtime.server.metrics import render_metrics

logger = logging.getLogger("runtime.server")

API_VERSION = "0.5.23"  # the SGLang HTTP API this server speaks
HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLang's default SGLANG_HEALTH_CHECK_TIMEOUT


class ApiKeyMiddleware:
    """SGLang's auth: with --api-key all routes but health/ready/metrics need `Authorization: Bearer <key>`.

    Pure ASGI (not BaseHTTPMiddleware) so a streaming client's disconnect still reaches the route.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allowed(scope):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        path: str = scope.get("path", "")
        if scope.get("method") == "OPTIONS" or path.startswith(("/health", "/ready", "/metrics")):
            return True
        # The first Authorization header counts, as in SGLang (starlette's `headers.get` returns the first of
        # repeated headers); a dict of the raw list would keep the last. ASGI servers lowercase header names.
        # Bytes, not str: compare_digest refuses non-ASCII str, and a header is whatever bytes a client sent.
        auth = next((value for name, value in scope.get("headers") or [] if name == b"authorization"), b"")
        parts = auth.split(b" ", 1)
        return len(parts) == 2 and parts[0].lower() == b"bearer" and secrets.compare_digest(parts[1], self.api_key)


def _ctx(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    return ctx


async def health_generate(request: Request) -> Response:
    """As SGLang: 503 until warmed up; then 200 once the engine produces any output within the timeout.
    503 at once when the engine loop has died (the process is exiting for its supervisor to restart it)."""
    ctx = _ctx(request)
    if not ctx.ready or ctx.engine_failure() is not None:
        return Response(status_code=503)
    probe = GenerateRequest(
        rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
        # Two tokens, not SGLang's one: a fresh one-token prompt is the one prefill the native kernels leave to
        # the eager torch forward, whose first run kept ~18 MB more resident on real-size Qwen3-Next; two take
        # the native short extend that the start-up warm-up already ran.
        input_ids=[0, 0],
        sampling=SamplingParams(temperature=0.0, max_new_tokens=1),
        cache_result=False,
    )
    try:
        group = RequestGroup(ctx.engine, [probe])
    except RuntimeError:  # the engine stopped between the check above and now
        return Response(status_code=503)
    batches = group.batches()
    try:
        # Answered as soon as the probe's first output arrives (no polling interval on top of the engine step).
        await asyncio.wait_for(anext(batches), HEALTH_CHECK_TIMEOUT_S)
        return Response(status_code=200)
    except TimeoutError:
        logger.error("Health check failed: no output from the engine for %.0f seconds", HEALTH_CHECK_TIMEOUT_S)
        return Response(status_code=503)
    finally:
        await batches.aclose()
        group.close()


async def ready(request: Request) -> Response:
    ctx = _ctx(request)
    return Response(status_code=200 if ctx.ready and ctx.engine_failure() is None else 503)


def model_info_dict(ctx: ServerContext) -> dict[str, Any]:
    return {
        "model_path": ctx.args.model_path,
        "served_model_name": ctx.model_name,
        "tokenizer_path": ctx.args.resolved_tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": ctx.args.reasoning_parser,
        "tool_call_parser": ctx.args.tool_call_parser,
        "disaggregation_mode": ctx.args.disaggregation_mode,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": ctx.hf_config.get("model_type"),
        "architectures": ctx.hf_config.get("architectures"),
    }


async def model_info(request: Request) -> Response:
    return JSONResponse(model_info_dict(_ctx(request)))


async def get_model_info(request: Request) -> Response:
    logger.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                   "Please use '/model_info' instead.")  # fmt: skip
    return await model_info(request)


async def server_info(request: Request) -> Response:
    ctx = _ctx(request)
    stats = await ctx.stats()
    internal = asdict(stats)
    internal["last_gen_throughput"] = stats.gen_throughput  # SGLang's key for the same number
    resolved = await asyncio.to_thread(ctx.client.resolved_args)
    body: dict[str, Any] = {
        **ctx.args.public_dict(),
        **{k: v for k, v in resolved.items() if k != "api_key"},
        "served_model_name": ctx.model_name,
        "tokenizer_path": ctx.args.resolved_tokenizer_path,
        "max_total_num_tokens": stats.max_total_num_tokens,
        "max_running_requests": stats.max_running_requests,
        "max_mamba_cache_size": stats.max_mamba_cache_size,
        "context_length": stats.context_len,
        "startup_time": ctx.startup_time,
        "internal_states": [internal],
        "version": API_VERSION,
        "runtime": "hybridctl bundled runtime",
        "frontend": "python",
    }
    return JSONResponse(body)


async def get_server_info(request: Request) -> Response:
    logger.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                   "Please use '/server_info' instead.")  # fmt: skip
    return await server_info(request)


FLUSH_POLL_S = 0.02


async def flush_cache(request: Request) -> Response:
    """SGLang's /flush_cache[?timeout=N]: flush now if idle; with N > 0, wait up to N s for running and
    waiting requests to finish, then flush (new requests are still admitted meanwhile, as in SGLang)."""
    ctx = _ctx(request)
    raw = request.query_params.get("timeout", "0")
    try:
        timeout = float(raw)
    except ValueError:
        timeout = float("nan")
    if not math.isfinite(timeout) or timeout < 0:
        return error_response(f"timeout must be a number of seconds >= 0, got {raw[:40]!r}")
    if ctx.flushing:
        return PlainTextResponse("Another flush_cache is already in progress.", status_code=400)
    ctx.flushing = True
    try:
        deadline = time.monotonic() + timeout
        ok = await asyncio.to_thread(ctx.client.flush_cache)
        while not ok and time.monotonic() < deadline:
            await asyncio.sleep(FLUSH_POLL_S)
            ok = await asyncio.to_thread(ctx.client.flush_cache)
    except RuntimeError as e:  # the engine loop is not running
        return error_response(str(e), 503, "ServiceUnavailable")
    finally:
        ctx.flushing = False
    if not ok and timeout > 0:
        return PlainTextResponse("Timed out waiting for idle state.", status_code=400)
    if ok:
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n"
        )
    stats = await ctx.stats()
    return PlainTextResponse(
        "Cache not flushed because there are pending requests. "
        f"#queue-req: {stats.num_queue_reqs}, #running-req: {stats.num_running_reqs}\n",
        status_code=400,
    )


async def metrics(request: Request) -> Response:
    ctx = _ctx(request)
    text = render_metrics(await ctx.stats(), ctx.timings, ctx.model_name)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def http_error(request: Request, exc: Exception) -> Response:
    """404, 405 and the like as JSON (Starlette's default is plain text)."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"Not found: {request.method} {request.url.path} is not a route of this server"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return error_response(message, exc.status_code, "NotFound" if exc.status_code == 404 else "BadRequest",
                          headers=exc.headers)  # fmt: skip


async def internal_error(request: Request, exc: Exception) -> Response:
    # A bug, not bad input: the traceback goes to the log, the client gets JSON (never the traceback).
    logger.error("Internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"error": {"message": f"Internal server error ({type(exc).__name__})"}}, status_code=500)


def build_app(
    ctx: ServerContext,
    warmup: Callable[[], Coroutine[Any, Any, None]] | None = None,
    watchdog: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> ASGIApp:
    """The ASGI app; `warmup` (an async callable) runs once the server listens, then the server is ready;
    `watchdog` (an async callable) runs alongside for the server's life."""
    routes = [
        Route("/health", health_generate, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_model_info", get_model_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", get_server_info, methods=["GET"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/generate", generate_api.generate, methods=["POST", "PUT"]),
        *openai_api.routes(),
    ]
    if ctx.args.enable_metrics:
        routes.append(Route("/metrics", metrics, methods=["GET"]))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(job()) for job in (warmup, watchdog) if job is not None]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()

    handlers = {HTTPException: http_error, Exception: internal_error}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    app.state.ctx = ctx
    if ctx.args.api_key:
        return ApiKeyMiddleware(app, ctx.args.api_key)
    return app
