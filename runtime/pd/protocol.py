"""The PD transfer over loopback TCP: framed JSON messages, the layout both sides compare, and one payload.

A transfer (decode D connects to prefill P's bootstrap port):

    D -> P  {"op": "fetch", "room": R}
    P -> D  {"status": "ok", "layout": ..., "tensors": [...], "payload_bytes": n, "crc32": c, ...}
            or {"status": "error", "message": ...} (the prefill of room R failed or never came)
    D -> P  {"op": "accept"} or {"op": "reject", "message": ...} (layouts differ: nothing is sent)
    P -> D  n payload bytes: every full-attention layer's K and V for the prompt, then every linear layer's
            conv and SSM state, in the header's order
    D -> P  {"op": "ack"} once the payload is whole and its checksum matches

Atomic: the decode side allocates nothing until the whole payload has arrived and checks out, so a dropped
connection leaves no slot taken on either side, and the prefill side keeps the staged copy for a retry.
"""

from __future__ import annotations

import json
import socket
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import torch

from runtime.core.batch import PoolBuffers

MISMATCH = "PD transfer mamba state size mismatch"
MAX_JSON_BYTES = 1 << 24
_LEN = struct.Struct("!I")


class TransferError(RuntimeError):
    """The transfer failed; `retryable` is False where a retry cannot help (layouts differ, no prefill)."""

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


def send_json(sock: socket.socket, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise TransferError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def recv_json(sock: socket.socket) -> dict[str, Any]:
    (n,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    if n > MAX_JSON_BYTES:
        raise TransferError(f"message header of {n} bytes is larger than {MAX_JSON_BYTES}: not a PD peer")
    obj = json.loads(recv_exact(sock, n))
    if not isinstance(obj, dict):
        raise TransferError("malformed PD message (not a JSON object)")
    return obj


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _nbytes(shape: list[int], dtype: torch.dtype) -> int:
    n = torch.empty((), dtype=dtype).element_size()
    for d in shape:
        n *= d
    return n


def pool_layout(buffers: PoolBuffers, model_type: str, tp_size: int = 1) -> dict[str, Any]:
    """What one request's KV (per token) and state (per slot) look like in this server's pools."""
    k, v = (buffers.k[0], buffers.v[0]) if buffers.k else (None, None)
    conv, ssm = (buffers.conv[0], buffers.ssm[0]) if buffers.conv else (None, None)

    def describe(t: torch.Tensor | None) -> dict[str, Any] | None:
        return None if t is None else {"shape": list(t.shape[1:]), "dtype": _dtype_name(t.dtype)}

    state_bytes = sum(t[0].numel() * t.element_size() for t in (*buffers.conv, *buffers.ssm))
    kv_bytes = sum(t[0].numel() * t.element_size() for t in (*buffers.k, *buffers.v))
    return {
        "model_type": model_type,
        "tp_size": tp_size,
        "attn_layers": len(buffers.k),
        "linear_layers": len(buffers.conv),
        "k": describe(k),
        "v": describe(v),
        "conv": describe(conv),
        "ssm": describe(ssm),
        "state_bytes_per_request": state_bytes,
        "kv_bytes_per_token": kv_bytes,
    }


def _state_words(layout: dict[str, Any]) -> str:
    conv, ssm = layout.get("conv") or {}, layout.get("ssm") or {}
    return (
        f"{layout.get('state_bytes_per_request')} bytes of recurrent state per request "
        f"({layout.get('linear_layers')} linear layers, conv {conv.get('shape')} {conv.get('dtype')}, "
        f"ssm {ssm.get('shape')} {ssm.get('dtype')}; model_type {layout.get('model_type')}, "
        f"tp_size {layout.get('tp_size')}) and {layout.get('kv_bytes_per_token')} KV bytes per token"
    )


def layout_mismatch(prefill: dict[str, Any], decode: dict[str, Any]) -> str | None:
    """None when a prefill server's transfer fits this decode server's pools, else the one-paragraph error."""
    if prefill == decode:
        return None
    return (
        f"{MISMATCH}: the prefill server sends {_state_words(prefill)}, but this decode server's slots hold "
        f"{_state_words(decode)}. Fix: start both servers from the same model and the same --dtype, "
        f"--mamba-ssm-dtype and --tp-size (with hybridctl, one config.toml whose [pd] section starts both)."
    )


@dataclass
class Staged:
    """A finished prefill, copied out of the pools: what the decode server needs to go on."""

    prompt_ids: list[int]
    first_token: int
    first_logprob: float | None
    tensors: list[tuple[str, torch.Tensor]]  # (name, CPU tensor) in payload order
    cached_tokens: int = 0  # prompt tokens the prefill server found in its prefix cache

    def header(self, layout: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        chunks: list[bytes] = []
        entries: list[dict[str, Any]] = []
        for name, t in self.tensors:
            raw = t.contiguous().view(torch.uint8).numpy().tobytes()
            entries.append({"name": name, "shape": list(t.shape), "dtype": _dtype_name(t.dtype),
                            "nbytes": len(raw)})  # fmt: skip
            chunks.append(raw)
        payload = b"".join(chunks)
        head = {
            "status": "ok",
            "layout": layout,
            "prompt_len": len(self.prompt_ids),
            "prompt_crc32": zlib.crc32(json.dumps(self.prompt_ids).encode()),
            "first_token": self.first_token,
            "first_logprob": self.first_logprob,
            "cached_tokens": self.cached_tokens,
            "tensors": entries,
            "payload_bytes": len(payload),
            "crc32": zlib.crc32(payload),
        }
        return head, payload


def unpack_payload(head: dict[str, Any], payload: bytes) -> list[tuple[str, torch.Tensor]]:
    """The header's tensors out of the payload; a short or corrupted payload raises TransferError."""
    if len(payload) != head["payload_bytes"] or zlib.crc32(payload) != head["crc32"]:
        raise TransferError(
            f"payload checksum mismatch ({len(payload)} of {head['payload_bytes']} bytes): corrupted transfer"
        )
    out: list[tuple[str, torch.Tensor]] = []
    offset = 0
    for entry in head["tensors"]:
        dtype = getattr(torch, entry["dtype"])
        n = entry["nbytes"]
        if n != _nbytes(entry["shape"], dtype):
            raise TransferError(f"tensor {entry['name']}: {n} bytes do not match {entry['shape']} {dtype}")
        raw = torch.frombuffer(bytearray(payload[offset : offset + n]), dtype=torch.uint8)
        out.append((entry["name"], raw.view(dtype).reshape(entry["shape"])))
        offset += n
    return out
