"""The decode server's side: fetch each request's KV and state from its prefill server, then decode it.

A request carrying `bootstrap_host/port/room` is not computed here from scratch: a fetch thread pulls the
transfer (retrying a dropped connection up to FETCH_ATTEMPTS times), checks the prefill server's layout
against this server's pools before any byte of payload moves, and only then asks the engine thread to admit
the request with the transferred memory (engine_ops.inject). Every request ends with exactly one final
output, whatever happens to its transfer.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from runtime.core.requests import GenerateRequest, RequestOutput
from runtime.engine.engine_thread import ThreadedEngineClient
from runtime.pd.engine_ops import inject
from runtime.pd.protocol import (
    TransferError,
    layout_mismatch,
    recv_exact,
    recv_json,
    send_json,
    unpack_payload,
)
from runtime.pd.role import RoleClient

logger = logging.getLogger("runtime.pd")

FETCH_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 10.0
FETCH_TIMEOUT_S = 330.0  # longer than the prefill side's FETCH_WAIT_S: its error answer arrives first
ADMIT_WAIT_S = 600.0
_ADMIT_POLL_S = 0.01


class DecodeClient(RoleClient):
    """The engine client of a `--disaggregation-mode decode` server."""

    mode = "decode"

    def __init__(self, inner: ThreadedEngineClient, layout: dict[str, Any]) -> None:
        super().__init__(inner)
        self.layout = layout
        self._cancelled: set[str] = set()
        self._fetching: set[str] = set()
        self._lock = threading.Lock()
        self.transfers_ok = 0
        self.transfers_failed = 0

    def add_request(self, req: GenerateRequest, on_output: Callable[[RequestOutput], None]) -> None:
        if not req.disaggregated:
            self.inner.add_request(req, on_output)  # warm-up, health probes and plain use: served whole
            return
        if not req.bootstrap_host or req.bootstrap_port is None:
            raise ValueError("bootstrap_room needs bootstrap_host and bootstrap_port (the prefill server's)")
        with self._lock:
            self._fetching.add(req.rid)
        threading.Thread(target=self._run, args=(req, on_output), name=f"pd-fetch-{req.rid}", daemon=True).start()

    def abort(self, rid: str) -> None:
        with self._lock:
            if rid in self._fetching:
                self._cancelled.add(rid)
                return
        self.inner.abort(rid)

    def shutdown(self) -> None:
        with self._lock:
            self._cancelled.update(self._fetching)
        self.inner.shutdown()

    # -- fetch thread ----------------------------------------------------------------------------------------

    def _is_cancelled(self, rid: str) -> bool:
        with self._lock:
            return rid in self._cancelled

    def _run(self, req: GenerateRequest, on_output: Callable[[RequestOutput], None]) -> None:
        try:
            head, tensors = self._fetch(req)
            deadline = time.monotonic() + ADMIT_WAIT_S
            while True:
                if self._is_cancelled(req.rid):
                    raise _Cancelled
                admitted = self.inner.call_in_engine(lambda core: inject(core, req, on_output, head, tensors))
                if admitted is None:
                    with self._lock:  # admitted: from now on an abort goes to the engine like any other
                        self._fetching.discard(req.rid)
                        late_abort = req.rid in self._cancelled
                        self._cancelled.discard(req.rid)
                    if late_abort:
                        self.inner.abort(req.rid)
                    break
                if time.monotonic() > deadline:
                    raise TransferError(f"no memory for the transferred request within {ADMIT_WAIT_S:.0f}s")
                time.sleep(_ADMIT_POLL_S)
            self.transfers_ok += 1
        except _Cancelled:
            self._fail(req, on_output, "Aborted by the client.", 499, "ClientDisconnect")
        except TransferError as exc:
            logger.error("request %s: PD transfer failed: %s", req.rid, exc)
            self._fail(req, on_output, f"PD transfer failed: {exc}", 503, "ServiceUnavailable")
        except Exception as exc:  # noqa: BLE001 - the request must still end with one final output
            logger.exception("request %s: PD transfer failed", req.rid)
            message = f"PD transfer failed: {type(exc).__name__}: {exc}"
            self._fail(req, on_output, message, 500, "InternalError")

    def _fail(
        self, req: GenerateRequest, on_output: Callable[[RequestOutput], None], message: str, status: int,
        err_type: str,
    ) -> None:  # fmt: skip
        with self._lock:
            self._fetching.discard(req.rid)
            self._cancelled.discard(req.rid)
        self.transfers_failed += 1
        reason = {"type": "abort", "message": message, "status_code": status, "err_type": err_type}
        on_output(RequestOutput(req.rid, [], True, reason, len(req.input_ids), 0, 0))

    def _fetch(self, req: GenerateRequest) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]]]:
        last: TransferError | None = None
        for attempt in range(1, FETCH_ATTEMPTS + 1):
            if self._is_cancelled(req.rid):
                raise _Cancelled
            try:
                return self._fetch_once(req)
            except TransferError as exc:
                if not exc.retryable:
                    raise
                last = exc
            except OSError as exc:
                last = TransferError(f"{type(exc).__name__}: {exc}")
            logger.warning("request %s: PD transfer attempt %d/%d failed (%s)", req.rid, attempt,
                           FETCH_ATTEMPTS, last)  # fmt: skip
            time.sleep(0.2 * attempt)
        raise TransferError(f"{last} (after {FETCH_ATTEMPTS} attempts to {req.bootstrap_host}:{req.bootstrap_port})")

    def _fetch_once(self, req: GenerateRequest) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]]]:
        address = (str(req.bootstrap_host), int(req.bootstrap_port or 0))
        with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S) as sock:
            sock.settimeout(FETCH_TIMEOUT_S)
            send_json(sock, {"op": "fetch", "room": req.bootstrap_room})
            head = recv_json(sock)
            if head.get("status") != "ok":
                raise TransferError(str(head.get("message", head)), retryable=False)
            problem = layout_mismatch(head["layout"], self.layout)
            if problem is not None:
                send_json(sock, {"op": "reject", "message": problem})
                raise TransferError(problem, retryable=False)
            send_json(sock, {"op": "accept"})
            payload = recv_exact(sock, int(head["payload_bytes"]))
            tensors = unpack_payload(head, payload)
            send_json(sock, {"op": "ack"})
        return head, tensors


class _Cancelled(Exception):
    pass
