"""A small PD router: one public address in front of a prefill server and a decode server (SGLang's PD mode).

`python -m hybridctl.launch.pd_router --prefill URL BOOTSTRAP_PORT --decode URL --host H --port P`

Each single-prompt generation request goes to both servers at once with the same `rid` and SGLang's routing
fields (`bootstrap_host`, `bootstrap_port`, a fresh random `bootstrap_room`): the prefill server computes the
prompt, the decode server fetches its KV and state from the prefill server's bootstrap port and generates the
answer, which is what the client gets. Batches go to the decode server alone (computed there whole). The
other routes answer from the decode server; /health is 200 only when both servers are. No torch here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import secrets
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

if TYPE_CHECKING:  # starlette comes with the runtime extra; the control plane imports this module without it
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

logger = logging.getLogger("hybridctl.pd_router")

GENERATION_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")
_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding"}


@dataclass(frozen=True)
class Workers:
    prefill: str
    bootstrap_port: int
    decode: str

    @property
    def bootstrap_host(self) -> str:
        return urlsplit(self.prefill).hostname or "127.0.0.1"


def single_prompt(path: str, body: dict[str, Any]) -> bool:
    """Whether the body is one prompt (PD-routed) rather than a batch (sent to the decode server whole)."""
    if path == "/v1/chat/completions":
        return True
    if path == "/v1/completions":
        prompt = body.get("prompt")
        return isinstance(prompt, str) or _ids(prompt)
    return isinstance(body.get("text"), str) or _ids(body.get("input_ids"))


def _ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) for t in value)


def pd_bodies(workers: Workers, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(prefill body, decode body) for one request: the same rid and room on both sides."""
    routed = {
        **body,
        "rid": body.get("rid") if isinstance(body.get("rid"), str) else uuid.uuid4().hex,
        "bootstrap_host": workers.bootstrap_host,
        "bootstrap_port": workers.bootstrap_port,
        "bootstrap_room": secrets.randbits(63),
    }
    return {**routed, "stream": False}, routed


class PDRouter:
    """The router's state (one HTTP client, the prefill calls in flight) and its route handlers."""

    def __init__(self, workers: Workers, timeout_s: float) -> None:
        self.workers = workers
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0))
        self.background: set[asyncio.Task[None]] = set()

    async def generation(self, request: Request) -> Response:
        """One prompt: prefill in the background, the decode server's answer (streamed or not) to the client."""
        path = request.url.path
        raw = await request.body()
        headers = _auth_headers(request)
        decode_body = self._route_prefill(path, raw, headers)
        content = raw if decode_body is None else json.dumps(decode_body).encode()
        send_headers = {**headers, "Content-Type": "application/json"}
        req = self.client.build_request("POST", self.workers.decode + path, content=content, headers=send_headers)
        try:
            res = await self.client.send(req, stream=True)
        except httpx.HTTPError as exc:
            return _unreachable("decode", self.workers.decode, exc)
        return await _relay_answer(res)

    def _route_prefill(self, path: str, raw: bytes, headers: dict[str, str]) -> dict[str, Any] | None:
        """Start the prefill half of a single-prompt request; its decode body (None: send the body as is)."""
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        if not isinstance(body, dict) or not single_prompt(path, body):
            return None
        prefill_body, decode_body = pd_bodies(self.workers, path, body)
        task = asyncio.create_task(self._prefill_call(path, prefill_body, headers))
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return decode_body

    async def _prefill_call(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        try:
            res = await self.client.post(self.workers.prefill + path, json=body, headers=headers)
            if res.status_code != 200:
                logger.warning("prefill %s answered %d: %s", body.get("rid"), res.status_code, res.text[:300])
        except httpx.HTTPError as exc:
            logger.warning("prefill %s failed: %s", body.get("rid"), exc)

    async def from_decode(self, request: Request) -> Response:
        try:
            res = await self.client.request(
                request.method, self.workers.decode + request.url.path, headers=_auth_headers(request),
                content=await request.body(), params=dict(request.query_params),
            )  # fmt: skip
        except httpx.HTTPError as exc:
            return _unreachable("decode", self.workers.decode, exc)
        return _relay(res, res.content)

    async def both(self, request: Request) -> Response:
        """/health and /flush_cache: the answer of whichever server is not fine, else the decode server's."""
        answers: list[httpx.Response] = []
        for role, url in (("prefill", self.workers.prefill), ("decode", self.workers.decode)):
            try:
                answers.append(await self.client.request(request.method, url + request.url.path,
                                                         headers=_auth_headers(request)))  # fmt: skip
            except httpx.HTTPError as exc:
                return _unreachable(role, url, exc)
        for res in answers:
            if res.status_code != 200:
                return _relay(res, res.content)
        return _relay(answers[-1], answers[-1].content)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Any) -> AsyncIterator[None]:
        w = self.workers
        logger.info("PD router: prefill %s (bootstrap port %d), decode %s", w.prefill, w.bootstrap_port, w.decode)
        try:
            yield
        finally:
            for task in list(self.background):
                task.cancel()
            await self.client.aclose()


def _auth_headers(request: Request) -> dict[str, str]:
    auth = request.headers.get("authorization")
    return {"Authorization": auth} if auth else {}


def _unreachable(role: str, url: str, exc: Exception) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": f"PD router: the {role} server at {url} is unreachable ({exc}); check its "
                   "log, then restart the deployment (hybridctl stop, then hybridctl launch)."}},
        status_code=503,
    )  # fmt: skip


def _relay(res: httpx.Response, content: bytes) -> Response:
    from starlette.responses import Response

    headers = {k: v for k, v in res.headers.items() if k.lower() not in _HOP_HEADERS}
    return Response(content, status_code=res.status_code, headers=headers)


async def _relay_answer(res: httpx.Response) -> Response:
    """The decode server's answer: read whole, or passed through chunk by chunk when it is an event stream."""
    from starlette.responses import StreamingResponse

    if not res.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            data = await res.aread()
        finally:
            await res.aclose()
        return _relay(res, data)

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in res.aiter_raw():
                yield chunk
        finally:
            await res.aclose()

    return StreamingResponse(chunks(), status_code=res.status_code, media_type="text/event-stream")


def build_app(workers: Workers, timeout_s: float = 3600.0) -> Starlette:
    from starlette.applications import Starlette
    from starlette.routing import Route

    router = PDRouter(workers, timeout_s)
    routes = [Route(p, router.generation, methods=["POST"]) for p in GENERATION_ROUTES]
    routes += [Route(p, router.both, methods=["GET"]) for p in ("/health", "/health_generate")]
    routes.append(Route("/flush_cache", router.both, methods=["GET", "POST"]))
    routes += [
        Route(p, router.from_decode, methods=["GET"])
        for p in ("/ready", "/model_info", "/get_model_info", "/server_info", "/get_server_info", "/metrics",
                  "/v1/models")
    ]  # fmt: skip
    return Starlette(routes=routes, lifespan=router.lifespan)


def parse_args(argv: list[str] | None = None) -> tuple[Workers, str, int]:
    p = argparse.ArgumentParser(prog="python -m hybridctl.launch.pd_router", description="PD router")
    p.add_argument("--prefill", nargs=2, metavar=("URL", "BOOTSTRAP_PORT"), required=True)
    p.add_argument("--decode", metavar="URL", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    ns = p.parse_args(argv)
    try:
        bootstrap = int(ns.prefill[1])
    except ValueError:
        p.error(f"--prefill URL BOOTSTRAP_PORT: {ns.prefill[1]!r} is not a port number")
    return Workers(ns.prefill[0].rstrip("/"), bootstrap, ns.decode.rstrip("/")), ns.host, ns.port


def main(argv: list[str] | None = None) -> int:
    workers, host, port = parse_args(argv)
    logging.basicConfig(level="INFO", format="[%(asctime)s] %(message)s", stream=sys.stdout)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    import uvicorn

    uvicorn.run(build_app(workers), host=host, port=port, log_level="warning", timeout_keep_alive=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
