"""What crosses between the server process and the engine process (`--engine-process`): message kinds and the
values that are not already plain dataclasses. Every message is a tuple whose first item is its kind; both
ends pickle them over one `multiprocessing.connection.Connection` (a socket pair, one per server).

Server -> engine: (ADD, GenerateRequest), (ABORT, rid), (FLUSH, call_id), (STOP,); the first message is an
`EngineInit`. Engine -> server: (READY, EngineStats, resolved_args), (STARTUP_ERROR, one line),
(STEP, [RequestOutput, ...], EngineStats | None, failure | None) once per engine step that produced outputs or
a new stats snapshot, (REPLY, call_id, ok, value).

No torch here: the server side imports this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.core.config import EngineArgs
from runtime.core.requests import GenerateRequest, RequestOutput

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


def abort_output(req: GenerateRequest, message: str, status_code: int) -> RequestOutput:
    """The final output of a request that never ran (as the scheduler's own abort says it)."""
    err_type = {400: "BadRequestError", 499: "ClientDisconnect", 503: "ServiceUnavailable"}.get(
        status_code, "InternalServerError"
    )
    reason = {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}
    return RequestOutput(req.rid, [], True, reason, len(req.input_ids), 0, 0)
