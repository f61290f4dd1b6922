"""The one table from every config.toml / settings.json key to engine flags, for SGLang (by version) and the bundled
runtime.

Each key gets a `Target` per engine: a real flag; "built-in" (the engine always behaves this way and has no switch:
SGLang's unified radix cache snapshots state on a match, copies on write and keeps a separate state LRU);
"not-supported" (no equivalent; launching refuses a value the engine would silently ignore); or "client-side" (read by
hybridctl itself, never an engine flag). Command builders, the ignored-key check and docs/sglang-mapping.md are all
derived from `ROWS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.mapping_row import Kind, MappingRow, Target, equals, flag


def _spec_on(cfg: HybridConfig) -> bool:
    return cfg.speculative_enabled


def _pd_on(cfg: HybridConfig) -> bool:
    return cfg.config.pd.enable_pd_disaggregation


def _elastic_on(cfg: HybridConfig) -> bool:
    return cfg.config.memory.enable_elastic_memory_pool


def _compile_on(cfg: HybridConfig) -> bool:
    return cfg.settings.runtime.enable_torch_compile


CLIENT = Target("client-side", note="read by hybridctl, not passed to the engine")
ONE_DEVICE = "the bundled runtime serves on one device"
_UNIFIED = "0.5.15"  # first release with --enable-unified-memory (bisected over published wheels)
_SCHED = "0.5.7"  # first release with --mamba-scheduler-strategy
_LAZY = "0.5.13"  # extra_buffer_lazy joins the old flag's choices (sglang-releases.json)
_RADIX = "0.5.14"  # --mamba-radix-cache-strategy replaces it (the old name is gone from 0.5.20)


def _row(file: str, key: str, sglang: Target | tuple[Target, ...], builtin: Target, **kw: Any) -> MappingRow:
    targets = sglang if isinstance(sglang, tuple) else (sglang,)
    return MappingRow(file, key, targets, builtin, **kw)  # type: ignore[arg-type]


def _both(file: str, key: str, flag_name: str, kind: Kind = "value", **kw: Any) -> MappingRow:
    """A key both engines take as the same flag."""
    return _row(file, key, flag(flag_name, kind), flag(flag_name, kind), **kw)


def _one_device(
    key: str, flag_name: str, single: Any, when: Callable[[HybridConfig], bool] | None = None
) -> MappingRow:
    """A multi-device key: an SGLang flag; the bundled runtime accepts only the single-device value."""
    builtin = Target("not-supported", accepts=equals(single), note=ONE_DEVICE)
    return _row(C, key, flag(flag_name), builtin, **({"when": when} if when else {}))


def _always_on_in_sglang(file: str, key: str, sglang_note: str, builtin_flag: str, **kw: Any) -> MappingRow:
    """A behaviour SGLang always has (no switch, so only true is honoured) that the runtime can turn off."""
    builtin = flag(builtin_flag, "false", note=kw.pop("builtin_note", ""))
    return _row(file, key, Target("built-in", accepts=equals(True), note=sglang_note), builtin, **kw)


C, S = "config.toml", "settings.json"

ROWS: tuple[MappingRow, ...] = (
    # --- [server]
    _both(C, "server.model_path", "--model-path"),
    _both(C, "server.tokenizer_path", "--tokenizer-path"),
    _both(C, "server.host", "--host"),
    # The server's own key, read from the variable (only its NAME is on argv). SGLang 0.5.23 takes a key only as a
    # value (--api-key, visible in ps): launch does not pass one, so a key set here would silently not be required.
    _row(
        C, "server.api_key_env",
        Target("not-supported", accepts=equals(None),
               note="SGLang takes a key only as a value (--api-key): put api-key in a chmod 600 --config YAML"),
        flag("--api-key-env", note="requires this key, read from the variable (its name on argv)"),
    ),  # fmt: skip
    _row(C, "server.port", flag("--port", note="under PD: the router's port"), flag("--port")),
    _both(C, "server.trust_remote_code", "--trust-remote-code", "true"),
    _row(C, "server.engine", CLIENT, CLIENT),
    _row(C, "server.sglang_version", CLIENT, CLIENT),  # the release the commands are written for
    _one_device("server.tp_size", "--tp-size", 1),
    _one_device("server.dp_size", "--dp-size", 1, lambda cfg: cfg.config.server.dp_size > 1),
    _one_device("server.ep_size", "--ep-size", 1, lambda cfg: cfg.config.server.ep_size > 1),
    _one_device("server.nnodes", "--nnodes", 1, lambda cfg: cfg.config.server.nnodes > 1),
    _one_device("server.node_rank", "--node-rank", 0, lambda cfg: cfg.config.server.nnodes > 1),
    _one_device("server.dist_init_addr", "--dist-init-addr", None, lambda cfg: cfg.config.server.nnodes > 1),
    # --- [memory]
    _both(C, "memory.mem_fraction_static", "--mem-fraction-static"),
    _both(C, "memory.mamba_full_memory_ratio", "--mamba-full-memory-ratio"),
    _both(C, "memory.max_mamba_cache_size", "--max-mamba-cache-size"),
    _row(
        C,
        "memory.enable_elastic_memory_pool",
        flag(
            "--enable-unified-memory",
            "true",
            since=_UNIFIED,
            note="SGLang's unified memory pool (CUDA VMM): one buffer split at run time between KV and state",
        ),
        flag(
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
        flag("--elastic-realloc-timeout-s"),
        when=_elastic_on,
    ),
    _row(
        C,
        "memory.memory_budget_gib",
        Target(
            "not-supported",
            accepts=equals(None),
            note="bundled runtime only: SGLang sizes pools from the GPU's memory",
        ),
        flag("--memory-budget-gib"),
    ),
    _row(C, "memory.gpu_mem_gib", CLIENT, CLIENT),  # the GPU size plan and doctor size for off the server
    # --- [cache]
    _both(C, "cache.enable_prefix_caching", "--disable-radix-cache", "false"),
    _both(C, "cache.radix_cache_page_size", "--page-size"),
    _always_on_in_sglang(
        C,
        "cache.enable_dual_lru_eviction",
        "the unified radix cache keeps Mamba states on their own LRU list, evicted before KV",
        "--disable-dual-lru-eviction",
    ),
    _row(
        C,
        "cache.mamba_radix_cache_strategy",
        (
            flag(
                "--mamba-radix-cache-strategy",
                since=_RADIX,
                note="no_buffer also gets --disable-overlap-schedule (SGLang refuses no_buffer with overlap)",
            ),
            flag(
                "--mamba-scheduler-strategy",
                since=_LAZY,
                until=_RADIX,
                note="the older name of the same flag",
            ),
            flag(
                "--mamba-scheduler-strategy",
                since=_SCHED,
                until=_LAZY,
                accepts=lambda v, _cfg: v != "extra_buffer_lazy",
                note="extra_buffer_lazy did not exist before 0.5.13",
            ),
        ),
        flag("--mamba-radix-cache-strategy"),
    ),
    _row(
        C,
        "cache.mamba_track_interval",
        flag("--mamba-track-interval", since=_SCHED),
        flag("--mamba-track-interval"),
    ),
    # --- [speculative]
    _row(
        C,
        "speculative.speculative_algorithm",
        flag("--speculative-algorithm", note="none: no flag"),
        flag(
            "--speculative-algorithm",
            accepts=equals("none", "NGRAM", "STANDALONE", "NEXTN", "EAGLE"),
            note="EAGLE3 has no bundled-runtime drafter",
        ),
        when=_spec_on,
    ),
    _both(C, "speculative.speculative_num_steps", "--speculative-num-steps", when=_spec_on),
    _both(C, "speculative.speculative_num_draft_tokens", "--speculative-num-draft-tokens", when=_spec_on),
    _row(
        C,
        "speculative.speculative_topk",
        flag("--speculative-eagle-topk"),
        flag("--speculative-eagle-topk", accepts=equals(1), note="chain drafts only (topk 1)"),
        when=_spec_on,
    ),
    _both(C, "speculative.speculative_draft_model_path", "--speculative-draft-model-path", when=_spec_on),
    _always_on_in_sglang(
        C,
        "speculative.enable_mamba_state_sandbox",
        "SGLang always gives draft tokens their own intermediate state slots",
        "--disable-mamba-state-sandbox",
        builtin_note="false: the runtime refuses to start (speculative decoding state rollback error)",
        when=_spec_on,
    ),
    # --- [pd]
    _row(
        C,
        "pd.enable_pd_disaggregation",
        flag(
            "--disaggregation-mode",
            accepts=lambda v, _cfg: True,
            note="true: a prefill server (--disaggregation-mode prefill), a decode server (decode) and "
            "sglang-router; see `hybridctl launch --dry-run`",
        ),
        flag(
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
            accepts=equals("atomic"),
            note="SGLang sends a request's Mamba state with its KV in one transfer; layerwise: no equivalent",
        ),
        Target("built-in", accepts=equals("atomic"), note="runtime/pd: every layer's KV and state at once"),
        when=_pd_on,
    ),
    _row(
        C,
        "pd.prefill_port",
        flag("--port", note="the prefill server's --port"),
        flag("--port", note="the prefill runtime's --port"),
        when=_pd_on,
    ),
    _row(
        C,
        "pd.decode_port",
        flag("--port", note="the decode server's --port"),
        flag("--port", note="the decode runtime's --port"),
        when=_pd_on,
    ),
    _both(C, "pd.bootstrap_port", "--disaggregation-bootstrap-port", when=_pd_on),
    _row(
        C,
        "extra_engine_args",
        Target("flag", note="each entry becomes --name value, checked against the flag table of the version"),
        Target("flag", note="each entry becomes --name value, checked against the runtime's flags"),
    ),
    # --- settings.json [runtime]
    _both(S, "runtime.chunked_prefill_size", "--chunked-prefill-size"),
    _both(S, "runtime.max_running_requests", "--max-running-requests"),
    _row(
        S,
        "runtime.schedule_policy",
        flag("--schedule-policy"),
        flag(
            "--schedule-policy",
            accepts=equals("fcfs", "lpm"),
            note="the bundled runtime implements fcfs, lpm",
        ),
    ),
    _both(S, "runtime.disable_radix_cache", "--disable-radix-cache", "true"),
    _both(S, "runtime.enable_torch_compile", "--enable-torch-compile", "true"),
    _both(S, "runtime.torch_compile_max_bs", "--torch-compile-max-bs", when=_compile_on),
    _row(
        S,
        "runtime.torch_compile_max_extend_tokens",
        Target(
            "not-supported",
            accepts=lambda v, cfg: not _compile_on(cfg) or v == 128,
            note="bundled runtime only: SGLang's torch.compile covers decode",
        ),
        flag("--torch-compile-max-extend-tokens"),
        when=_compile_on,
    ),
    # --- [mamba]
    _both(S, "mamba.state_dtype", "--mamba-ssm-dtype"),
    _always_on_in_sglang(
        S,
        "mamba.state_snapshot_on_match",
        "a prefix hit copies the cached state into a fresh slot for the request",
        "--disable-state-snapshot-on-match",
    ),
    _always_on_in_sglang(
        S, "mamba.state_copy_on_write", "cached states are never written in place", "--disable-state-copy-on-write"
    ),
    # --- [logging]
    _both(S, "logging.level", "--log-level"),
    _both(S, "logging.log_requests", "--log-requests", "true"),
    _row(
        S,
        "logging.log_mamba_state_stats",
        Target(
            "not-supported",
            accepts=equals(False),
            note="no periodic state-pool log; use --enable-metrics and sglang:mamba_usage",
        ),
        flag("--log-mamba-state-stats", "true"),
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
