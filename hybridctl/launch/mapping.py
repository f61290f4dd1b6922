"""The one table from every config.toml / settings.json key to engine flags, for SGLang (by version) and the
bundled runtime.

Each key gets a `Target` per engine: a real flag; "built-in" (the engine always behaves this way and has
no switch: SGLang's unified radix cache snapshots state on a match, copies on write and keeps a separate
state LRU); "not-supported" (no equivalent; launching refuses a value the engine would silently ignore); or
"client-side" (read by hybridctl itself, never an engine flag). Command builders, the ignored-key check and
docs/sglang-mapping.md are all derived from `ROWS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.version import in_range, version_key

Status = Literal["flag", "built-in", "not-supported", "client-side"]
# How a value becomes argv: "value" = --flag VALUE (skipped when None), "true" = --flag when truthy,
# "false" = --flag when falsy (enable_x = false -> --disable-x).
Kind = Literal["value", "true", "false"]

Accepts = Callable[[Any, HybridConfig], bool]


def _always(_value: Any, _cfg: HybridConfig) -> bool:
    return True


@dataclass(frozen=True)
class Target:
    status: Status
    flag: str | None = None
    kind: Kind = "value"
    since: str | None = None  # first SGLang release with this flag (inclusive)
    until: str | None = None  # first release without it (exclusive)
    # flag: values the engine can take; built-in / not-supported: values it honours anyway (no flag needed).
    accepts: Accepts = _always
    note: str = ""

    def applies_to(self, version: str | None) -> bool:
        return version is None or in_range(version, self.since, self.until)


@dataclass(frozen=True)
class MappingRow:
    file: Literal["config.toml", "settings.json"]
    key: str  # dotted within the file: "memory.mem_fraction_static"
    sglang: tuple[Target, ...]  # alternatives by version range; the first that applies wins
    builtin: Target
    # Only consulted when this holds (e.g. speculative keys only with an algorithm): else the key is moot.
    when: Callable[[HybridConfig], bool] = field(default=lambda _cfg: True)

    @property
    def qualified(self) -> str:
        return f"{self.file}:{self.key}"

    def sglang_target(self, version: str) -> Target:
        for target in self.sglang:
            if target.applies_to(version):
                return target
        first = min((t.since for t in self.sglang if t.since), key=version_key, default=None)
        return Target(
            "not-supported",
            accepts=_is_default(self),
            note=f"no flag before SGLang {first}" if first else "no flag in this SGLang version",
        )


def config_value(cfg: HybridConfig, row: MappingRow) -> Any:
    node: Any = cfg.config if row.file == "config.toml" else cfg.settings
    for part in row.key.split("."):
        node = getattr(node, part)
    return node


def default_value(row: MappingRow) -> Any:
    return config_value(HybridConfig(), row)


def _is_default(row: MappingRow) -> Accepts:
    return lambda value, _cfg: value == default_value(row)


def _flag(flag: str, kind: Kind = "value", **kw: Any) -> Target:
    return Target("flag", flag, kind, **kw)


def _equals(*values: Any) -> Accepts:
    return lambda value, _cfg: value in values


def _spec_on(cfg: HybridConfig) -> bool:
    return cfg.speculative_enabled


def _pd_on(cfg: HybridConfig) -> bool:
    return cfg.config.pd.enable_pd_disaggregation


def _elastic_on(cfg: HybridConfig) -> bool:
    return cfg.config.memory.enable_elastic_memory_pool


CLIENT = Target("client-side", note="read by hybridctl, not passed to the engine")
ONE_DEVICE = "the bundled runtime serves on one device"
_UNIFIED = "0.5.15"  # first release with --enable-unified-memory (bisected over published wheels)
_SCHED = "0.5.7"  # first release with --mamba-scheduler-strategy
_RADIX = "0.5.14"  # --mamba-radix-cache-strategy replaces it (the old name is gone from 0.5.20)


def _row(file: str, key: str, sglang: Target | tuple[Target, ...], builtin: Target, **kw: Any) -> MappingRow:
    targets = sglang if isinstance(sglang, tuple) else (sglang,)
    return MappingRow(file, key, targets, builtin, **kw)  # type: ignore[arg-type]


C, S = "config.toml", "settings.json"

ROWS: tuple[MappingRow, ...] = (
    # --- [server]
    _row(C, "server.model_path", _flag("--model-path"), _flag("--model-path")),
    _row(C, "server.tokenizer_path", _flag("--tokenizer-path"), _flag("--tokenizer-path")),
    _row(C, "server.host", _flag("--host"), _flag("--host")),
    _row(C, "server.port", _flag("--port", note="under PD: the router's port"), _flag("--port")),
    _row(
        C,
        "server.trust_remote_code",
        _flag("--trust-remote-code", "true"),
        _flag("--trust-remote-code", "true"),
    ),
    _row(C, "server.engine", CLIENT, CLIENT),
    _row(
        C, "server.tp_size", _flag("--tp-size"), Target("not-supported", accepts=_equals(1), note=ONE_DEVICE)
    ),
    _row(
        C,
        "server.dp_size",
        _flag("--dp-size"),
        Target("not-supported", accepts=_equals(1), note=ONE_DEVICE),
        when=lambda cfg: cfg.config.server.dp_size > 1,
    ),
    _row(
        C,
        "server.ep_size",
        _flag("--ep-size"),
        Target("not-supported", accepts=_equals(1), note=ONE_DEVICE),
        when=lambda cfg: cfg.config.server.ep_size > 1,
    ),
    _row(
        C,
        "server.nnodes",
        _flag("--nnodes"),
        Target("not-supported", accepts=_equals(1), note=ONE_DEVICE),
        when=lambda cfg: cfg.config.server.nnodes > 1,
    ),
    _row(
        C,
        "server.node_rank",
        _flag("--node-rank"),
        Target("not-supported", accepts=_equals(0), note=ONE_DEVICE),
        when=lambda cfg: cfg.config.server.nnodes > 1,
    ),
    _row(
        C,
        "server.dist_init_addr",
        _flag("--dist-init-addr"),
        Target("not-supported", accepts=_equals(None), note=ONE_DEVICE),
        when=lambda cfg: cfg.config.server.nnodes > 1,
    ),
    # --- [memory]
    _row(C, "memory.mem_fraction_static", _flag("--mem-fraction-static"), _flag("--mem-fraction-static")),
    _row(
        C,
        "memory.mamba_full_memory_ratio",
        _flag("--mamba-full-memory-ratio"),
        _flag("--mamba-full-memory-ratio"),
    ),
    _row(C, "memory.max_mamba_cache_size", _flag("--max-mamba-cache-size"), _flag("--max-mamba-cache-size")),
    _row(
        C,
        "memory.enable_elastic_memory_pool",
        _flag(
            "--enable-unified-memory",
            "true",
            since=_UNIFIED,
            note="SGLang's unified memory pool (CUDA VMM): one buffer split at run time between KV and state",
        ),
        _flag(
            "--enable-elastic-memory-pool",
            "true",
            note="one buffer re-split between KV pages and state slots (runtime/kvcache/elastic_pool.py)",
        ),
    ),
    _row(
        C,
        "memory.elastic_realloc_timeout_s",
        Target(
            "not-supported",
            accepts=lambda v, cfg: not _elastic_on(cfg) or v == 5.0,
            note="SGLang's unified pool has no reallocation deadline setting",
        ),
        _flag("--elastic-realloc-timeout-s"),
        when=_elastic_on,
    ),
    _row(
        C,
        "memory.memory_budget_gib",
        Target(
            "not-supported",
            accepts=_equals(None),
            note="bundled runtime only: SGLang sizes pools from the GPU's memory",
        ),
        _flag("--memory-budget-gib"),
    ),
    # --- [cache]
    _row(
        C,
        "cache.enable_prefix_caching",
        _flag("--disable-radix-cache", "false"),
        _flag("--disable-radix-cache", "false"),
    ),
    _row(C, "cache.radix_cache_page_size", _flag("--page-size"), _flag("--page-size")),
    _row(
        C,
        "cache.enable_dual_lru_eviction",
        Target(
            "built-in",
            accepts=_equals(True),
            note="the unified radix cache keeps Mamba states on their own LRU list, evicted before KV",
        ),
        _flag("--disable-dual-lru-eviction", "false"),
    ),
    _row(
        C,
        "cache.mamba_radix_cache_strategy",
        (
            _flag(
                "--mamba-radix-cache-strategy",
                since=_RADIX,
                note="no_buffer also gets --disable-overlap-schedule (SGLang refuses no_buffer with overlap)",
            ),
            _flag(
                "--mamba-scheduler-strategy",
                since=_SCHED,
                until=_RADIX,
                accepts=lambda v, _cfg: v != "extra_buffer_lazy",
                note="the older name of the same flag; extra_buffer_lazy did not exist yet",
            ),
        ),
        _flag("--mamba-radix-cache-strategy"),
    ),
    _row(
        C,
        "cache.mamba_track_interval",
        _flag("--mamba-track-interval", since=_SCHED),
        _flag("--mamba-track-interval"),
    ),
    # --- [speculative]
    _row(
        C,
        "speculative.speculative_algorithm",
        _flag("--speculative-algorithm", note="none: no flag"),
        _flag(
            "--speculative-algorithm",
            accepts=_equals("none", "NGRAM", "STANDALONE", "NEXTN", "EAGLE"),
            note="EAGLE3 has no bundled-runtime drafter",
        ),
        when=_spec_on,
    ),
    _row(
        C,
        "speculative.speculative_num_steps",
        _flag("--speculative-num-steps"),
        _flag("--speculative-num-steps"),
        when=_spec_on,
    ),
    _row(
        C,
        "speculative.speculative_num_draft_tokens",
        _flag("--speculative-num-draft-tokens"),
        _flag("--speculative-num-draft-tokens"),
        when=_spec_on,
    ),
    _row(
        C,
        "speculative.speculative_topk",
        _flag("--speculative-eagle-topk"),
        _flag("--speculative-eagle-topk", accepts=_equals(1), note="chain drafts only (topk 1)"),
        when=_spec_on,
    ),
    _row(
        C,
        "speculative.speculative_draft_model_path",
        _flag("--speculative-draft-model-path"),
        _flag("--speculative-draft-model-path"),
        when=_spec_on,
    ),
    _row(
        C,
        "speculative.enable_mamba_state_sandbox",
        Target(
            "built-in",
            accepts=_equals(True),
            note="SGLang always gives draft tokens their own intermediate state slots",
        ),
        _flag(
            "--disable-mamba-state-sandbox",
            "false",
            note="false: the runtime refuses to start (speculative decoding state rollback error)",
        ),
        when=_spec_on,
    ),
    # --- [pd]
    _row(
        C,
        "pd.enable_pd_disaggregation",
        _flag(
            "--disaggregation-mode",
            accepts=lambda v, _cfg: True,
            note="true: a prefill server (--disaggregation-mode prefill), a decode server (decode) and "
            "sglang-router; see `hybridctl launch --dry-run`",
        ),
        _flag(
            "--disaggregation-mode",
            accepts=lambda v, _cfg: True,
            note="true: prefill + decode runtimes and hybridctl's PD router (hybridctl/launch/pd_router.py)",
        ),
    ),
    _row(
        C,
        "pd.mamba_state_transfer_mode",
        Target(
            "built-in",
            accepts=_equals("atomic"),
            note="SGLang sends a request's Mamba state with its KV in one transfer; layerwise: no equivalent",
        ),
        Target("built-in", accepts=_equals("atomic"), note="runtime/pd: every layer's KV and state at once"),
        when=_pd_on,
    ),
    _row(
        C,
        "pd.prefill_port",
        _flag("--port", note="the prefill server's --port"),
        _flag("--port", note="the prefill runtime's --port"),
        when=_pd_on,
    ),
    _row(
        C,
        "pd.decode_port",
        _flag("--port", note="the decode server's --port"),
        _flag("--port", note="the decode runtime's --port"),
        when=_pd_on,
    ),
    _row(
        C,
        "pd.bootstrap_port",
        _flag("--disaggregation-bootstrap-port"),
        _flag("--disaggregation-bootstrap-port"),
        when=_pd_on,
    ),
    _row(
        C,
        "extra_engine_args",
        Target("flag", note="each entry becomes --name value, checked against the flag table of the version"),
        Target("flag", note="each entry becomes --name value, checked against the runtime's flags"),
    ),
    # --- settings.json [runtime]
    _row(S, "runtime.chunked_prefill_size", _flag("--chunked-prefill-size"), _flag("--chunked-prefill-size")),
    _row(S, "runtime.max_running_requests", _flag("--max-running-requests"), _flag("--max-running-requests")),
    _row(
        S,
        "runtime.schedule_policy",
        _flag("--schedule-policy"),
        _flag(
            "--schedule-policy",
            accepts=_equals("fcfs", "lpm"),
            note="the bundled runtime implements fcfs, lpm",
        ),
    ),
    _row(
        S,
        "runtime.disable_radix_cache",
        _flag("--disable-radix-cache", "true"),
        _flag("--disable-radix-cache", "true"),
    ),
    # --- [mamba]
    _row(S, "mamba.state_dtype", _flag("--mamba-ssm-dtype"), _flag("--mamba-ssm-dtype")),
    _row(
        S,
        "mamba.state_snapshot_on_match",
        Target(
            "built-in",
            accepts=_equals(True),
            note="a prefix hit copies the cached state into a fresh slot for the request",
        ),
        _flag("--disable-state-snapshot-on-match", "false"),
    ),
    _row(
        S,
        "mamba.state_copy_on_write",
        Target("built-in", accepts=_equals(True), note="cached states are never written in place"),
        _flag("--disable-state-copy-on-write", "false"),
    ),
    # --- [logging]
    _row(S, "logging.level", _flag("--log-level"), _flag("--log-level")),
    _row(S, "logging.log_requests", _flag("--log-requests", "true"), _flag("--log-requests", "true")),
    _row(
        S,
        "logging.log_mamba_state_stats",
        Target(
            "not-supported",
            accepts=_equals(False),
            note="no periodic state-pool log; use --enable-metrics and sglang:mamba_usage",
        ),
        _flag("--log-mamba-state-stats", "true"),
    ),
    # --- [api]: the upstream gateway verify compares against
    _row(S, "api.base_url", CLIENT, CLIENT),
    _row(S, "api.api_key_env", CLIENT, CLIENT),
    _row(S, "api.timeout_seconds", CLIENT, CLIENT),
)


def row_for(qualified_or_key: str) -> MappingRow:
    for row in ROWS:
        if qualified_or_key in (row.key, row.qualified):
            return row
    raise KeyError(qualified_or_key)
