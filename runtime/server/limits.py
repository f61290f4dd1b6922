"""Input limits checked before any work: the body's size (before it is read whole), its JSON nesting, and the
prompt's size before it is tokenized. Each refusal is a 4xx with JSON naming what was too big and the limit.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

MIN_BODY_LIMIT = 1 << 20  # 1 MiB: a chat request with a long history fits even for a small context
BODY_BYTES_PER_TOKEN = 32  # generous: a token is ~4 bytes of text, ~8 as a JSON id; chat/escape overhead
MAX_JSON_DEPTH = 64  # OpenAI bodies nest a handful of levels; deeper is an attack, not a request
# A token covers at most about the longest vocabulary entry's bytes (ServerTokenizer.max_token_bytes); a
# normalizer may shrink text a little (NFKC, accents), so the pre-check allows this factor on top.
NORMALIZATION_SLACK = 4


class BadJson(ValueError):
    """Not a JSON document (400)."""


class BodyTooLarge(BadJson):
    """Past the body limit (413); the rest of the body is never read."""


def default_body_limit(context_len: int) -> int:
    """The default request-body limit: room for a full-context prompt in any of the API's forms."""
    return max(MIN_BODY_LIMIT, BODY_BYTES_PER_TOKEN * context_len)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with BodyTooLarge as soon as it is known to exceed `limit` (header or bytes read)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BadJson(f"Content-Length {declared[:40]!r} is not a number") from None
        if size > limit:
            raise BodyTooLarge(_too_large(size, limit))
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise BodyTooLarge(_too_large(received, limit, at_least=True))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int, at_least: bool = False) -> str:
    return (
        f"Request body {'of at least ' if at_least else 'of '}{size} bytes exceeds the limit of {limit} bytes "
        "(--max-request-body-bytes; the default is sized from the context length)"
    )


def too_deep(value: Any) -> bool:
    """True when containers nest deeper than MAX_JSON_DEPTH (iterative: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > MAX_JSON_DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


def parse_json(raw: bytes) -> Any:
    """json.loads, refusing documents nested deeper than MAX_JSON_DEPTH; BadJson for anything else not JSON."""
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadJson(f"JSON decode error: {e}") from None
    except RecursionError:
        raise BadJson(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    # Nesting needs an opening bracket a level: a body with few of them cannot be too deep, and counting bytes
    # is ~100x cheaper than walking a 2000-id prompt (~0.3 ms of time to first token). Brackets inside strings
    # only make the count larger, never let a deep document through.
    few_brackets = raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH if isinstance(raw, bytes) else False
    if isinstance(value, dict | list) and not few_brackets and too_deep(value):
        raise BadJson(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def prompt_too_long(text_bytes: int, max_token_bytes: int, context_len: int) -> str | None:
    """A reason when a prompt of `text_bytes` UTF-8 bytes cannot fit the context whatever it tokenizes to."""
    if text_bytes > NORMALIZATION_SLACK * max(1, max_token_bytes) * context_len:
        return (
            f"The prompt ({text_bytes} bytes of text) is longer than the model's context length "
            f"({context_len} tokens) can hold; refused before tokenizing."
        )
    return None
