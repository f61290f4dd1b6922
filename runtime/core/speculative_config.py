"""Speculative-decoding options as the engine resolves them, and the start-up refusals naming the key to
change.

SGLang's names: `speculative_algorithm` (NEXTN is an alias of EAGLE: both draft from the checkpoint's MTP
layer), `speculative_num_steps`, `speculative_eagle_topk`, `speculative_num_draft_tokens` (tokens in one
verify forward: the last accepted token + the drafts, so steps + 1 for a chain)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hybridshared.flags.runtime_args import SPEC_ALGORITHMS

logger = logging.getLogger("runtime.speculative")

# SGLang's default steps when --speculative-num-steps is not given (server_args auto-choice for a chain).
DEFAULT_NUM_STEPS = 3


class SpecConfigError(ValueError):
    """The speculative options cannot run; the message names the flag and config.toml key to change."""


@dataclass(frozen=True)
class SpecConfig:
    algorithm: str  # NGRAM | STANDALONE | EAGLE (NEXTN resolves to EAGLE)
    num_steps: int  # drafts per round
    num_draft_tokens: int  # tokens per verify forward = num_steps + 1 (topk 1)
    draft_model_path: str | None = None

    @property
    def num_drafts(self) -> int:
        return self.num_draft_tokens - 1


def resolve_spec_config(
    algorithm: str | None,
    num_steps: int | None,
    num_draft_tokens: int | None,
    topk: int | None,
    draft_model_path: str | None,
    *,
    sandbox: bool,
) -> SpecConfig | None:
    """None when speculative decoding is off; raises SpecConfigError for options the runtime cannot honour."""
    if algorithm in (None, "", "none", "NONE"):
        return None
    name = algorithm.upper()
    if name not in SPEC_ALGORITHMS:
        raise SpecConfigError(
            f"--speculative-algorithm {algorithm}: the bundled runtime implements {', '.join(SPEC_ALGORITHMS)}; "
            f'set [speculative] speculative_algorithm in config.toml to one of them (or "none").'
        )
    if not sandbox:
        raise SpecConfigError(
            "Speculative decoding state rollback error: the Mamba state sandbox is disabled "
            "(--disable-mamba-state-sandbox), so a rejected draft token would leave its update in the "
            "request's recurrent state and every later token would be computed from a wrong state. Set "
            "[speculative] enable_mamba_state_sandbox = true in config.toml (drop "
            "--disable-mamba-state-sandbox), or turn speculative decoding off."
        )
    if topk not in (None, 1):
        raise SpecConfigError(
            f"--speculative-eagle-topk {topk}: the bundled runtime drafts a chain (topk 1) only; tree drafts "
            f"are not implemented. Set [speculative] speculative_topk = 1 in config.toml."
        )
    steps = num_steps if num_steps is not None else DEFAULT_NUM_STEPS
    if steps < 1:
        raise SpecConfigError(f"--speculative-num-steps {steps} must be >= 1 ([speculative] speculative_num_steps).")
    tokens = steps + 1
    if num_draft_tokens is not None and num_draft_tokens != tokens:
        # SGLang (arg_groups/speculative_hook.py) adjusts rather than refuses; so do we, saying so.
        logger.warning(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
            "speculative_eagle_topk == 1 (%d -> %d); set [speculative] speculative_num_draft_tokens = %d in "
            "config.toml to silence this",
            num_draft_tokens,
            tokens,
            tokens,
        )
    if name == "STANDALONE" and not draft_model_path:
        raise SpecConfigError(
            "--speculative-algorithm STANDALONE needs a draft model: pass --speculative-draft-model-path "
            "([speculative] speculative_draft_model_path in config.toml)."
        )
    if name == "NEXTN":
        name = "EAGLE"
    return SpecConfig(name, steps, tokens, draft_model_path)
