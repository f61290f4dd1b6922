"""HTTP client for SGLang 0.5.23's native API (and the bundled runtime, which speaks the same API).

One place that knows the endpoints, the SSE framing of streamed `/generate`, how time-to-first-token is taken (the first
chunk whose `meta_info.completion_tokens` is >= 1: a first token may decode to empty text), and how transport failures
become one clear `ServerUnreachable` instead of a traceback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from hybridctl.verify.prometheus import MetricsSnapshot, parse_metrics

Prompt = str | list[int]


class ServerUnreachable(Exception):
    """The server did not answer at all (connection refused, DNS, timeout on connect)."""


class ServerError(Exception):
    """The server answered, but not with what the API promises (status, body shape)."""


@dataclass(frozen=True)
class Target:
    """Where the server is and how to authenticate (key from an environment variable, never shown)."""

    url: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 300.0

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def generate_payload(
    prompt: Prompt, *, max_new_tokens: int, stream: bool, temperature: float = 0.0, ignore_eos: bool = False
) -> dict[str, Any]:
    key = "text" if isinstance(prompt, str) else "input_ids"
    return {
        key: prompt,
        "sampling_params": {
            "temperature": temperature,
            "max_new_tokens": max_new_tokens,
            "ignore_eos": ignore_eos,
        },
        "stream": stream,
    }


def parse_sse_data(line: str) -> dict[str, Any] | None:
    """One SSE line of a streamed `/generate`: its JSON object, or None (blank line, comment, `[DONE]`)."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if data == "[DONE]" or not data:
        return None
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ServerError(f"stream chunk is not a JSON object: {data[:120]!r}")
    if "error" in obj:
        raise ServerError(f"server reported an error mid-stream: {obj['error']}")
    return obj


@dataclass
class StreamResult:
    """Client-side timing of one streamed request (seconds from sending it)."""

    ttft_s: float | None = None
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    chunks: int = 0
    saw_done: bool = False
    text: str = ""  # the last chunk's text (SGLang streams the cumulative text)
    text_pieces: list[str] = field(
        default_factory=list
    )  # every chunk's text, for servers that stream increments
    meta_info: dict[str, Any] = field(default_factory=dict)

    @property
    def completion_tokens(self) -> int:
        return int(self.meta_info.get("completion_tokens", 0) or 0)

    @property
    def prompt_tokens(self) -> int:
        return int(self.meta_info.get("prompt_tokens", 0) or 0)

    @property
    def cached_tokens(self) -> int:
        return int(self.meta_info.get("cached_tokens", 0) or 0)


class StreamTracker:
    """Turns timestamped SSE lines into a StreamResult; shared by verify (sync) and bench (async)."""

    def __init__(self, start: float) -> None:
        self._start = start
        self._last_time = start
        self._last_tokens = 0
        self.result = StreamResult()

    def feed(self, line: str, now: float) -> None:
        stripped = line.strip()
        if stripped.startswith("data:") and stripped[len("data:") :].strip() == "[DONE]":
            self.result.saw_done = True
            return
        obj = parse_sse_data(line)
        if obj is None:
            return
        self.result.chunks += 1
        meta = obj.get("meta_info") or {}
        self.result.meta_info = meta
        if isinstance(obj.get("text"), str):
            self.result.text = obj["text"]
            self.result.text_pieces.append(obj["text"])
        tokens = int(meta.get("completion_tokens", 0) or 0)
        new_tokens = tokens - self._last_tokens
        if new_tokens <= 0:
            return
        if self.result.ttft_s is None:
            self.result.ttft_s = now - self._start
        else:
            # A chunk may carry several tokens; spread its gap over them, as SGLang's bench_serving does.
            gap = (now - self._last_time) / new_tokens
            self.result.itl_s.extend([gap] * new_tokens)
        self._last_time = now
        self._last_tokens = tokens

    def finish(self, now: float) -> StreamResult:
        self.result.e2e_s = now - self._start
        return self.result


def unreachable_message(url: str, exc: Exception) -> str:
    return (
        f"cannot reach the server at {url} ({type(exc).__name__}: {exc}). Is it running? Start it with "
        "`hybridctl launch`; or pass the right address with --url (or fix [server] host/port in config.toml)."
    )


class SGLangClient:
    """Synchronous client for the checks; its methods raise ServerUnreachable or ServerError, nothing else."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._http = httpx.Client(
            base_url=target.url.rstrip("/"),
            headers=target.headers(),
            timeout=httpx.Timeout(target.timeout_s, connect=10.0),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SGLangClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
            raise ServerUnreachable(unreachable_message(self.target.url, exc)) from exc
        except httpx.HTTPError as exc:
            raise ServerError(f"{method} {path} failed: {type(exc).__name__}: {exc}") from exc

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._request(method, path, **kwargs)
        if resp.status_code in (401, 403):
            raise ServerError(
                f"{method} {path}: HTTP {resp.status_code} — the server wants an API key; "
                "pass --api-key-env NAME with the key in that environment variable."
            )
        if resp.status_code != 200:
            raise ServerError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            return resp.json()
        except ValueError as exc:
            raise ServerError(f"{method} {path}: the body is not JSON: {resp.text[:200]!r}") from exc

    def health(self) -> int:
        return self._request("GET", "/health").status_code

    def model_info(self) -> dict[str, Any]:
        return self._json("GET", "/model_info")

    def server_info(self) -> dict[str, Any]:
        return self._json("GET", "/server_info")

    def server_info_any(self) -> dict[str, Any]:
        """/server_info, or /get_server_info on releases before it was renamed (SGLang < 0.4.7 answers 404)."""
        if self._request("GET", "/server_info").status_code == 404:
            return self._json("GET", "/get_server_info")
        return self.server_info()

    def flush_cache(self) -> tuple[bool, str]:
        resp = self._request("POST", "/flush_cache")
        return resp.status_code == 200, resp.text.strip()

    def metrics(self) -> MetricsSnapshot | None:
        """The parsed `/metrics`, or None when the server does not export them (SGLang: --enable-metrics)."""
        resp = self._request("GET", "/metrics")
        if resp.status_code != 200:
            return None
        return parse_metrics(resp.text)

    def generate(self, prompt: Prompt, *, max_new_tokens: int, **sampling: Any) -> dict[str, Any]:
        body = generate_payload(prompt, max_new_tokens=max_new_tokens, stream=False, **sampling)
        out = self._json("POST", "/generate", json=body)
        if not isinstance(out, dict) or "meta_info" not in out:
            raise ServerError(f"POST /generate: no meta_info in the answer: {str(out)[:200]}")
        return out

    def post_generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        """POST /generate with a full body: (HTTP status, the JSON answer or the text), for checks that judge
        a refusal themselves (an unreachable server still raises ServerUnreachable)."""
        resp = self._request("POST", "/generate", json=body)
        if resp.status_code in (401, 403):
            raise ServerError(
                f"POST /generate: HTTP {resp.status_code} — the server wants an API key; "
                "pass --api-key-env NAME with the key in that environment variable."
            )
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, resp.text[:300]

    def generate_stream(self, prompt: Prompt, *, max_new_tokens: int, **sampling: Any) -> StreamResult:
        body = generate_payload(prompt, max_new_tokens=max_new_tokens, stream=True, **sampling)
        start = time.perf_counter()
        tracker = StreamTracker(start)
        try:
            with self._http.stream("POST", "/generate", json=body) as resp:
                if resp.status_code != 200:
                    resp.read()
                    raise ServerError(f"POST /generate (stream): HTTP {resp.status_code}: {resp.text[:300]}")
                for line in _lines(resp.iter_lines()):
                    tracker.feed(line, time.perf_counter())
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ServerUnreachable(unreachable_message(self.target.url, exc)) from exc
        except httpx.HTTPError as exc:
            raise ServerError(f"POST /generate (stream) failed: {type(exc).__name__}: {exc}") from exc
        return tracker.finish(time.perf_counter())


def _lines(lines: Iterable[str]) -> Iterable[str]:
    for line in lines:
        if line:
            yield line
