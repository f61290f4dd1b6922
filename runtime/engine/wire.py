"""What crosses between the server process and the engine process (`--engine-process`): message kinds, the
values that are not already plain dataclasses, and the framing. Every message is a tuple whose first item is its
kind, pickled and sent as one length-prefixed frame; one socket pair per direction, so the server reads the
engine's messages from a non-blocking socket on its event loop (one `recv` per wake-up for all that arrived)
while its commands go out on a blocking one.

Server -> engine: (ADD, GenerateRequest), (ABORT, rid), (FLUSH, call_id), (STOP,); the first message is an
`EngineInit`. Engine -> server: (READY, EngineStats, resolved_args), (STARTUP_ERROR, one line),
(STEP, [RequestOutput row, ...], EngineStats row | None, failure | None) once per engine step that produced
outputs or a new stats snapshot, (REPLY, call_id, ok, value). A row is the dataclass's field values as a tuple:
unpickling a dataclass instance costs ~17 us for a one-token `RequestOutput` and ~60 us for `EngineStats` on
this project's 2-core test host, its row ~2.5 and ~5 us (and the per-step message is on both critical paths).

No torch here: the server side imports this.
"""

from __future__ import annotations

import pickle
import socket
import struct
from dataclasses import dataclass
from typing import Any

from runtime.core.config import EngineArgs
from runtime.core.requests import EngineStats, GenerateRequest, RequestOutput

ADD = "add"
ABORT = "abort"
FLUSH = "flush"
STOP = "stop"
READY = "ready"
STARTUP_ERROR = "startup_error"
STEP = "step"
REPLY = "reply"


@dataclass(frozen=True)
class GrammarSpec:
    """A request's structured-output constraint as text; the engine process compiles it (llguidance's compiled
    grammars are native objects that do not cross a process boundary)."""

    kind: str  # json_schema | regex | ebnf
    source: str


@dataclass
class EngineInit:
    """Everything the engine process needs to start, sent as the first message."""

    engine_args: EngineArgs
    num_threads: int | None  # --num-threads (torch's intra-op threads are per process)
    random_seed: int | None
    log_level: str
    # GrammarBackend.load's arguments (runtime/server/structured.py), None with --grammar-backend none.
    grammar: dict[str, Any] | None = None


def rows(items: list[RequestOutput]) -> list[tuple[Any, ...]]:
    """`RequestOutput`s as rows (their __init__ sets every field, in field order)."""
    return [tuple(vars(o).values()) for o in items]


def outputs(rows: list[tuple[Any, ...]]) -> list[RequestOutput]:
    return [RequestOutput(*row) for row in rows]


def stats_row(stats: EngineStats) -> tuple[Any, ...]:
    return tuple(vars(stats).values())


def abort_output(req: GenerateRequest, message: str, status_code: int) -> RequestOutput:
    """The final output of a request that never ran (as the scheduler's own abort says it)."""
    err_type = {400: "BadRequestError", 499: "ClientDisconnect", 503: "ServiceUnavailable"}.get(
        status_code, "InternalServerError"
    )
    reason = {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}
    return RequestOutput(req.rid, [], True, reason, len(req.input_ids), 0, 0)


_HEADER = struct.Struct("!Q")  # payload length


def frame(message: tuple[Any, ...] | EngineInit) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


class FrameReader:
    """Reassembles frames from whatever pieces a stream socket hands over."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """The messages completed by `data`, in order (a partial frame waits for the next piece)."""
        buf = self._buffer
        buf += data
        out: list[Any] = []
        pos, size = 0, len(buf)
        while size - pos >= _HEADER.size:
            (length,) = _HEADER.unpack_from(buf, pos)
            end = pos + _HEADER.size + length
            if end > size:
                break
            out.append(pickle.loads(buf[pos + _HEADER.size : end]))
            pos = end
        if pos:
            del buf[:pos]
        return out


def recv_blocking(sock: socket.socket, reader: FrameReader) -> list[Any]:
    """At least one message from a blocking socket; EOFError once the other end closed."""
    while True:
        data = sock.recv(1 << 16)
        if not data:
            raise EOFError("the other end closed the channel")
        messages = reader.feed(data)
        if messages:
            return messages
