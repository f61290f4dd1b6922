"""When a request is done: EOS / stop token ids, stop strings (on the decoded text), or its token budget."""

from __future__ import annotations

from typing import Any, Protocol

from runtime.scheduler.request import Req


class Detokenizer(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


def finish_reason_after(
    req: Req, token: int, eos_ids: tuple[int, ...], tok: Detokenizer | None
) -> dict[str, Any] | None:
    """SGLang's finish_reason for a request that just produced `token`, or None to go on."""
    p = req.sampling
    # SGLang's order (Req.update_finish_state): stop strings, then stop token ids and EOS (both off with
    # ignore_eos), then the length budget.
    if p.stop and tok is not None:
        # Only the tail can hold a new match: the longest stop string plus the newest token's text.
        tail_tokens = req.output_ids[-(max(len(s) for s in p.stop) + 8) :]
        tail = tok.decode(tail_tokens, skip_special_tokens=True)
        for s in p.stop:
            if s and s in tail:
                return {"type": "stop", "matched": s}
    if not p.ignore_eos and token in p.stop_ids(eos_ids):
        return {"type": "stop", "matched": token}
    if len(req.output_ids) >= req.max_new_tokens:
        return {"type": "length", "length": len(req.output_ids)}
    return None


def abort_reason(message: str, status_code: int, err_type: str) -> dict:
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}
