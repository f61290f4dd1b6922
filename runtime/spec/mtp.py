"""NEXTN / EAGLE drafting from the checkpoint's multi-token-prediction (MTP) layer."""

from __future__ import annotations

from torch import nn


def mtp_unavailable_reason(model: nn.Module) -> str | None:
    extra = getattr(model, "extra_weights", {})
    if not any(name.startswith("mtp.") for name in extra):
        return (
            f"--speculative-algorithm NEXTN/EAGLE drafts from the checkpoint's MTP layer, but "
            f"{type(model).__name__}'s checkpoint has no mtp.* weights. Use NGRAM, or STANDALONE with "
            f"[speculative] speculative_draft_model_path in config.toml."
        )
    return (
        "--speculative-algorithm NEXTN/EAGLE: drafting from the MTP layer is not implemented in the "
        "bundled runtime yet; use NGRAM, or STANDALONE with [speculative] speculative_draft_model_path in "
        "config.toml."
    )


class MtpDrafter:  # pragma: no cover - placeholder until the MTP head lands
    num_drafts = 0
