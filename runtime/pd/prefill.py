"""The prefill server's side: compute prompts, stage their KV and state, serve them on the bootstrap port.

A request carrying `bootstrap_room` is computed up to its first token (SGLang's prefill servers do the same);
just before its memory goes back to the pools, engine_ops.stage copies the prompt's KV and state out. The
staged copy waits for the decode server's fetch; it is dropped once the decode side acknowledges it, when the
decode side refuses it (layouts differ), or after STAGE_TTL_S. The pools are never held for a transfer, so a
decode server that dies mid-transfer cannot leak a slot here; a fetch that drops is simply served again.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.core.requests import GenerateRequest, RequestOutput
from runtime.engine.engine_thread import ThreadedEngineClient
from runtime.pd.engine_ops import stage
from runtime.pd.protocol import Staged, TransferError, recv_json, send_json
from runtime.pd.role import RoleClient
from runtime.scheduler.request import Req

logger = logging.getLogger("runtime.pd")

STAGE_TTL_S = 300.0  # a staged prefill nobody fetched in this long is dropped (counted as expired)
FETCH_WAIT_S = 300.0  # how long a fetch waits for its prefill to finish
ACK_TIMEOUT_S = 60.0


@dataclass
class Room:
    rid: str
    created: float = field(default_factory=time.monotonic)
    staged: Staged | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)  # staged or error is set


@dataclass
class TransferCounters:
    """Every room ends in exactly one of delivered / failed / expired; pending are the rest."""

    rooms_total: int = 0
    delivered: int = 0
    failed: int = 0
    expired: int = 0
    dropped_connections: int = 0  # fetches cut off mid-way (the room stays for a retry)
    bytes_sent: int = 0


class PrefillClient(RoleClient):
    """The engine client of a `--disaggregation-mode prefill` server, plus its bootstrap server."""

    mode = "prefill"

    def __init__(self, inner: ThreadedEngineClient, host: str, bootstrap_port: int, layout: dict[str, Any]) -> None:
        super().__init__(inner)
        self.layout = layout
        self.counters = TransferCounters()
        self._rooms: dict[int, Room] = {}
        self._room_of: dict[str, int] = {}  # rid -> room, while the prefill runs
        self._lock = threading.Condition()
        inner.core.before_release(self._on_release)
        self._server = _BootstrapServer((host, bootstrap_port), self)
        self._thread = threading.Thread(target=self._server.serve_forever, name="pd-bootstrap", daemon=True)
        self._thread.start()
        logger.info("PD prefill: bootstrap server listening on %s:%d", host, self._server.server_address[1])

    @property
    def bootstrap_port(self) -> int:
        return int(self._server.server_address[1])

    # -- EngineClient --------------------------------------------------------------------------------------

    def add_request(self, req: GenerateRequest, on_output: Callable[[RequestOutput], None]) -> None:
        room = req.bootstrap_room
        if room is None or not req.disaggregated:
            self.inner.add_request(req, on_output)  # warm-up, health probes and plain use: served whole
            return
        with self._lock:
            self._expire()
            if room in self._rooms:
                raise ValueError(f"bootstrap_room {room} is in use; the router must send unique rooms")
            self._rooms[room] = Room(req.rid)
            self._room_of[req.rid] = room
            self.counters.rooms_total += 1
            self._lock.notify_all()
        first_only = replace(req, sampling=replace(req.sampling, max_new_tokens=1))

        def relay(out: RequestOutput) -> None:  # engine thread
            if out.finished:
                self._prefill_finished(req.rid, out)
            on_output(out)

        self.inner.add_request(first_only, relay)

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.inner.shutdown()

    # -- staging (engine thread) -----------------------------------------------------------------------------

    def _on_release(self, req: Req) -> None:
        room_id = self._room_of.get(req.rid)
        if room_id is None:
            return
        staged = stage(self.inner.core, req)
        if staged is None:
            return
        with self._lock:
            room = self._rooms.get(room_id)
            if room is not None:
                room.staged = staged
                room.done.set()
                self._lock.notify_all()

    def _prefill_finished(self, rid: str, out: RequestOutput) -> None:
        with self._lock:
            room_id = self._room_of.pop(rid, None)
            room = self._rooms.get(room_id) if room_id is not None else None
            if room is None or room.staged is not None:
                return
            reason = out.finish_reason or {}
            room.error = f"the prefill of request {rid} did not complete: {reason.get('message') or reason}"
            room.done.set()
            self._lock.notify_all()

    # -- bootstrap (connection threads) ----------------------------------------------------------------------

    def _expire(self) -> None:
        now = time.monotonic()
        for room_id, room in list(self._rooms.items()):
            if room.rid not in self._room_of and now - room.created > STAGE_TTL_S:
                del self._rooms[room_id]
                self.counters.expired += 1
                logger.warning("PD prefill: room %d (rid %s) was never fetched; dropped", room_id, room.rid)

    def _end_room(self, room_id: int, outcome: str) -> None:
        with self._lock:
            if self._rooms.pop(room_id, None) is not None:
                setattr(self.counters, outcome, getattr(self.counters, outcome) + 1)

    def transfer_stats(self) -> dict[str, Any]:
        with self._lock:
            self._expire()
            pending = len(self._rooms)
            return {**vars(self.counters), "pending": pending, "layout": self.layout}

    def serve_fetch(self, sock: socket.socket, room_id: int) -> None:
        # The router sends both requests at once: the decode side's fetch may come before the prefill request.
        deadline = time.monotonic() + FETCH_WAIT_S
        with self._lock:
            while (room := self._rooms.get(room_id)) is None and time.monotonic() < deadline:
                self._lock.wait(min(1.0, max(0.0, deadline - time.monotonic())))
        if room is None:
            message = f"no prefill request with bootstrap_room {room_id} arrived in {FETCH_WAIT_S:.0f}s"
            send_json(sock, {"status": "error", "message": message})
            return
        if not room.done.wait(max(0.0, deadline - time.monotonic())):
            send_json(sock, {"status": "error", "message": f"the prefill of room {room_id} did not finish in "
                             f"{FETCH_WAIT_S:.0f}s"})  # fmt: skip
            return
        if room.staged is None:
            send_json(sock, {"status": "error", "message": room.error or "prefill failed"})
            self._end_room(room_id, "failed")
            return
        head, payload = room.staged.header(self.layout)
        try:
            send_json(sock, head)
            answer = recv_json(sock)
            if answer.get("op") == "reject":
                message = str(answer.get("message", ""))
                logger.error("PD transfer of room %d refused by the decode server: %s", room_id, message)
                self._end_room(room_id, "failed")
                return
            sock.sendall(payload)
            sock.settimeout(ACK_TIMEOUT_S)
            if recv_json(sock).get("op") != "ack":
                raise TransferError("no ack")
        except (OSError, TransferError, ValueError) as exc:
            with self._lock:
                self.counters.dropped_connections += 1
            logger.warning("PD transfer of room %d dropped (%s); kept for a retry", room_id, exc)
            return
        with self._lock:
            self.counters.bytes_sent += len(payload)
        self._end_room(room_id, "delivered")


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        assert isinstance(self.server, _BootstrapServer)  # the only server this handler is given to
        client = self.server.client
        sock: socket.socket = self.request
        sock.settimeout(FETCH_WAIT_S + 30)
        try:
            msg = recv_json(sock)
        except (OSError, TransferError, ValueError):
            return
        if msg.get("op") == "stats":
            send_json(sock, client.transfer_stats())
        elif msg.get("op") == "fetch" and isinstance(msg.get("room"), int):
            client.serve_fetch(sock, msg["room"])
        else:
            send_json(sock, {"status": "error", "message": f"unknown PD request {msg.get('op')!r}"})


class _BootstrapServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], client: PrefillClient) -> None:
        self.client = client
        super().__init__(address, _Handler)


def fetch_stats(host: str, port: int, timeout_s: float = 5.0) -> dict[str, Any]:
    """A prefill server's transfer counters, read over its bootstrap port (tests and operators)."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        send_json(sock, {"op": "stats"})
        return recv_json(sock)
