"""How one SGLang release sizes a hybrid model's pools: the facts `size_pools` is parametrized by.

SGLang moved this code three times (scripts/regen_sglang_flags.py records, per release, which file holds it as
`pool_sizing_code` in hybridshared/data/sglang-releases.json):
- model_runner (0.5.6): `ModelRunner.handle_max_mamba_cache` / `init_memory_pool`, model_executor/model_runner.py.
  No radix-cache strategy (3 state slots per request with the radix cache, 1 without); speculative decoding
  shrinks the slot count by 1 + draft tokens; the radix cache off and no request cap means 512 slots; the request
  cap is the flag as given, else SGLang's estimate, then the state pool's.
- kv_cache_mixin (0.5.7 - 0.5.15): model_executor/model_runner_kv_cache_mixin.py. --mamba-scheduler-strategy
  (auto = no_buffer) and extra_buffer's tracking slots; speculative scratch of max_running x draft states is
  reserved before the slots; the request cap is the flag clamped to the estimate, else min(estimate, tokens / 2).
- kv_cache_configurator (0.5.16 on): mem_cache/kv_cache_configurator.py, the arithmetic pool_sizing.py transcribes.
The state pool's padding slot is counted in the budget only by the configurator.
Verified against each family's own code by the tests (0.5.6, 0.5.10, 0.5.23); releases between share the family's
code with smaller changes elsewhere (bisect with the regen script's per-release facts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybridshared.flags.sglang_version import version_key

SpecScratch = Literal["per_slot", "per_running_request", "per_capped_request"]
RequestCap = Literal["as_given", "clamped_to_estimate", "kv_half_then_state"]


@dataclass(frozen=True)
class ReleaseSizing:
    code: str  # the sizing code family: model_runner | kv_cache_mixin | kv_cache_configurator
    verified_on: str  # the release whose lifted code the tests compare with
    strategies: tuple[str, ...]  # radix-cache strategies the release has; () = none (the 3-slot scheme)
    auto_strategy: str | None  # what "auto" becomes without further checks; None: resolved by overlap/paging
    spec_scratch: SpecScratch
    padding_slot_counted: bool  # (K + 1) slots charged to the budget, not K
    radix_off_default_slots: int | None  # slots when the radix cache is off and no request cap is given
    request_cap: RequestCap
    ratio_budget_after_scratch: bool  # the r / (1 + r) split applies to the budget left after spec scratch


MODEL_RUNNER = ReleaseSizing("model_runner", "0.5.6", (), "no_buffer", "per_slot", False, 512, "as_given", False)
KV_CACHE_MIXIN = ReleaseSizing(
    "kv_cache_mixin", "0.5.10", ("no_buffer", "extra_buffer"), "no_buffer", "per_running_request", False, None,
    "clamped_to_estimate", True,
)  # fmt: skip
KV_CACHE_CONFIGURATOR = ReleaseSizing(
    "kv_cache_configurator", "0.5.23", ("no_buffer", "extra_buffer", "extra_buffer_lazy"), None,
    "per_capped_request", True, None, "kv_half_then_state", False,
)  # fmt: skip

_FAMILIES = (("0.5.16", KV_CACHE_CONFIGURATOR), ("0.5.7", KV_CACHE_MIXIN), ("0", MODEL_RUNNER))


def release_sizing(version: str | None) -> ReleaseSizing:
    """The sizing facts of `version` (None: the newest family)."""
    if version is None:
        return KV_CACHE_CONFIGURATOR
    key = version_key(version)
    return next(facts for since, facts in _FAMILIES if key >= version_key(since))
