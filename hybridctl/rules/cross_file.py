"""Cross-file and engine rules: pure functions over a HybridConfig returning Findings with stable codes.

The doctor reuses these for its config-level predictions, so codes match its: PREFIX_CACHE_MISS,
SPEC_ROLLBACK, PD_STATE_MISMATCH. SGLang facts are from 0.5.23: arg_groups/mamba_hook.py
(validate_mamba_no_buffer, validate_mamba_extra_buffer), arg_groups/overrides.py (auto strategy) and
arg_groups/kv_cache_hook.py (handle_unified_memory_pool). Findings name the logical file ("config.toml" or
"settings.json") and the key; `check_files` points them at the real paths and lines.
"""

from __future__ import annotations

from collections.abc import Callable

from hybridctl.config.findings import CONFIG, SETTINGS, Finding, json_set, toml_set
from hybridctl.config.findings import rule_finding as _f
from hybridctl.config.schema import HybridConfig
from hybridctl.config.secret_scan import scan_for_secrets
from hybridctl.rules.builtin_rules import rule_builtin, rule_builtin_parser
from hybridctl.rules.engine_flag_rules import check_extra_engine_args
from hybridctl.rules.release_rules import rule_release
from hybridctl.rules.server_rules import rule_server

EXTRA_BUFFER_STRATEGIES = ("extra_buffer", "extra_buffer_lazy")
# --enable-unified-memory accepts these (NEXTN is SGLang's alias of EAGLE), and only a chain: topk 1.
ELASTIC_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")

Rule = Callable[[HybridConfig, "str | None"], list[Finding]]


def _prefix_on(cfg: HybridConfig) -> bool:
    return cfg.prefix_cache_enabled


def rule_prefix_cache(cfg: HybridConfig, engine_version: str | None = None) -> list[Finding]:
    """PREFIX_CACHE_MISS: settings that make prefix hits impossible or the engine refuse the cache setup."""
    cache, out = cfg.config.cache, []
    if cache.enable_prefix_caching and cfg.settings.runtime.disable_radix_cache:
        out.append(
            _f(
                "warning",
                "PREFIX_CACHE_MISS",
                SETTINGS,
                "runtime.disable_radix_cache",
                "prefix caching is on in [cache] of config.toml but settings.json disables the radix cache, "
                "which wins: every request recomputes its whole prompt and its recurrent state.",
                json_set("runtime.disable_radix_cache", "false")
                + " (or, to turn caching off on purpose, "
                + f"{toml_set('cache.enable_prefix_caching', 'false')})",
            )
        )
    if not _prefix_on(cfg):
        return out
    if cache.radix_cache_page_size > 1 and cache.mamba_radix_cache_strategy == "no_buffer":
        out.append(
            _f(
                "error",
                "PREFIX_CACHE_MISS",
                CONFIG,
                "cache.radix_cache_page_size",
                f"radix_cache_page_size = {cache.radix_cache_page_size} with mamba_radix_cache_strategy = "
                '"no_buffer": no_buffer keeps a recurrent state only at a sequence end, which is not '
                "pageable; "
                'SGLang 0.5.23 refuses it ("no_buffer only supports page_size=1").',
                f"{toml_set('cache.mamba_radix_cache_strategy', chr(34) + 'extra_buffer' + chr(34))}, or "
                f"{toml_set('cache.radix_cache_page_size', '1')}",
            )
        )
    elif cache.radix_cache_page_size > 1 and cache.mamba_radix_cache_strategy == "auto":
        out.append(
            _f(
                "warning",
                "PREFIX_CACHE_MISS",
                CONFIG,
                "cache.mamba_radix_cache_strategy",
                f'radix_cache_page_size = {cache.radix_cache_page_size} with strategy "auto": SGLang 0.5.23 '
                "picks extra_buffer only when the architecture and linear-attention backend (triton) "
                "support it, else no_buffer, which refuses page sizes above 1.",
                toml_set("cache.mamba_radix_cache_strategy", '"extra_buffer"') + " to make the choice explicit",
            )
        )
    if not cfg.settings.mamba.state_snapshot_on_match:
        out.append(
            _f(
                "warning",
                "PREFIX_CACHE_MISS",
                SETTINGS,
                "mamba.state_snapshot_on_match",
                "state_snapshot_on_match is off: a prefix hit cannot hand the cached recurrent state to the "
                "request, so hybrid models recompute the prefix (only attention KV would be reusable, which "
                "is not enough).",
                json_set("mamba.state_snapshot_on_match", "true"),
            )
        )
    return out


def rule_page_size(cfg: HybridConfig, engine_version: str | None = None) -> list[Finding]:
    """PAGE_SIZE_MISMATCH: extra_buffer checkpoints must fall on page boundaries (mamba_hook.py)."""
    cache = cfg.config.cache
    if not _prefix_on(cfg) or cache.mamba_radix_cache_strategy not in EXTRA_BUFFER_STRATEGIES:
        return []
    page, interval = cache.radix_cache_page_size, cache.mamba_track_interval
    if interval % page == 0:
        return []
    nearest = max(page, round(interval / page) * page)
    return [
        _f(
            "error",
            "PAGE_SIZE_MISMATCH",
            CONFIG,
            "cache.mamba_track_interval",
            f"mamba_track_interval = {interval} is not a multiple of radix_cache_page_size = {page}; "
            f"{cache.mamba_radix_cache_strategy} checkpoints states on page boundaries and SGLang asserts "
            "mamba_track_interval % page_size == 0.",
            toml_set("cache.mamba_track_interval", str(nearest)),
        )
    ]


def rule_speculative(cfg: HybridConfig, engine_version: str | None = None) -> list[Finding]:
    """SPEC_ROLLBACK: speculative decoding must roll the recurrent state back to the accepted token."""
    if not cfg.speculative_enabled:
        return []
    spec, cache, out = cfg.config.speculative, cfg.config.cache, []
    if not spec.enable_mamba_state_sandbox:
        out.append(
            _f(
                "error",
                "SPEC_ROLLBACK",
                CONFIG,
                "speculative.enable_mamba_state_sandbox",
                f"speculative decoding ({spec.speculative_algorithm}) is on but the state sandbox is off: "
                "drafts would write the request's recurrent state in place, and a rejected draft cannot be "
                "undone.",
                toml_set("speculative.enable_mamba_state_sandbox", "true"),
            )
        )
    interval, draft = cache.mamba_track_interval, spec.speculative_num_draft_tokens
    if _prefix_on(cfg) and interval < draft:
        explicit = cache.mamba_radix_cache_strategy in EXTRA_BUFFER_STRATEGIES
        if explicit or cache.mamba_radix_cache_strategy == "auto":
            out.append(
                _f(
                    "error" if explicit else "warning",
                    "SPEC_ROLLBACK",
                    CONFIG,
                    "cache.mamba_track_interval",
                    f"mamba_track_interval = {interval} is smaller than speculative_num_draft_tokens = "
                    f"{draft}: one verify round can cross two checkpoints"
                    + ("" if explicit else ' when "auto" resolves to extra_buffer (SGLang does on supported archs)')
                    + "; SGLang asserts mamba_track_interval >= speculative_num_draft_tokens.",
                    toml_set("cache.mamba_track_interval", str(max(draft, cache.radix_cache_page_size, 256))),
                )
            )
    steps = spec.speculative_num_steps
    if spec.speculative_topk == 1 and draft != steps + 1:
        out.append(
            _f(
                "warning",
                "SPEC_ROLLBACK",
                CONFIG,
                "speculative.speculative_num_draft_tokens",
                f"with speculative_topk = 1 the draft is a chain of speculative_num_steps + 1 = {steps + 1} "
                f"tokens, but speculative_num_draft_tokens = {draft}; SGLang silently adjusts it to "
                f"{steps + 1}, so the configured value (and pool sizing planned from it) is not what runs.",
                toml_set("speculative.speculative_num_draft_tokens", str(steps + 1)),
            )
        )
    if spec.speculative_algorithm == "STANDALONE" and not spec.speculative_draft_model_path:
        out.append(
            _f(
                "error",
                "SPEC_DRAFT_MODEL",
                CONFIG,
                "speculative.speculative_draft_model_path",
                'speculative_algorithm = "STANDALONE" drafts with a separate model, and none is given.',
                toml_set("speculative.speculative_draft_model_path", '"/path/to/draft-model"'),
            )
        )
    return out


def rule_spec_tree(cfg: HybridConfig, engine: str | None = None) -> list[Finding]:
    """SPEC_ROLLBACK from a draft tree on SGLang: its GDN/KDA verify kernels and MTP accept topk 1 only.

    (The bundled runtime's own refusal of trees is BUILTIN_UNSUPPORTED.)"""
    spec = cfg.config.speculative
    if not cfg.speculative_enabled or spec.speculative_topk == 1 or engine == "builtin":
        return []
    return [
        _f(
            "error",
            "SPEC_ROLLBACK",
            CONFIG,
            "speculative.speculative_topk",
            f"speculative_topk = {spec.speculative_topk} drafts a tree; rolling recurrent state back to the "
            "accepted branch needs a state per tree node, which SGLang's GDN/KDA verify kernels and MTP refuse "
            '("verify kernel only supports topk=1", "MTP requires --speculative-eagle-topk 1").',
            f"{toml_set('speculative.speculative_topk', '1')} and speculative_num_draft_tokens = "
            f"{spec.speculative_num_steps + 1} (steps + 1)",
        )
    ]


def rule_pd(cfg: HybridConfig, engine_version: str | None = None) -> list[Finding]:
    """PD_STATE_MISMATCH and friends: prefill and decode must hand over KV and recurrent state together."""
    pd = cfg.config.pd
    if not pd.enable_pd_disaggregation:
        return []
    out = []
    if pd.mamba_state_transfer_mode != "atomic":
        out.append(
            _f(
                "error",
                "PD_STATE_MISMATCH",
                CONFIG,
                "pd.mamba_state_transfer_mode",
                f'mamba_state_transfer_mode = "{pd.mamba_state_transfer_mode}": the decode server may start '
                "from a recurrent state that lags the transferred KV (state is per-request, not per-token, "
                "and cannot be merged layer by layer).",
                toml_set("pd.mamba_state_transfer_mode", '"atomic"'),
            )
        )
    if _prefix_on(cfg) and cfg.config.cache.mamba_radix_cache_strategy == "extra_buffer_lazy":
        out.append(
            _f(
                "error",
                "PD_STRATEGY_UNSUPPORTED",
                CONFIG,
                "cache.mamba_radix_cache_strategy",
                "extra_buffer_lazy is not supported under PD disaggregation (SGLang 0.5.23: the decode pool "
                "is not wired for lazy slots).",
                toml_set("cache.mamba_radix_cache_strategy", '"extra_buffer"'),
            )
        )
    ports = {
        "server.port": cfg.config.server.port,
        "pd.prefill_port": pd.prefill_port,
        "pd.decode_port": pd.decode_port,
        "pd.bootstrap_port": pd.bootstrap_port,
    }
    seen: dict[int, str] = {}
    for key, port in ports.items():
        if port in seen:
            out.append(
                _f(
                    "error",
                    "PORT_CONFLICT",
                    CONFIG,
                    key,
                    f"{key} = {port} is also {seen[port]}; under PD each server and the bootstrap need their own port.",
                    toml_set(key, str(max(ports.values()) + 1)),
                )
            )
        seen.setdefault(port, key)
    return out


def rule_elastic(cfg: HybridConfig, engine_version: str | None = None) -> list[Finding]:
    """ELASTIC_*: what --enable-unified-memory accepts (kv_cache_hook.py handle_unified_memory_pool)."""
    if not cfg.config.memory.enable_elastic_memory_pool or not cfg.speculative_enabled:
        return []
    spec, out = cfg.config.speculative, []
    if spec.speculative_algorithm not in ELASTIC_SPEC_ALGORITHMS:
        out.append(
            _f(
                "error",
                "ELASTIC_SPEC_UNSUPPORTED",
                CONFIG,
                "speculative.speculative_algorithm",
                "the elastic memory pool supports speculative decoding only with "
                f"{', '.join(ELASTIC_SPEC_ALGORITHMS)} (SGLang 0.5.23), not {spec.speculative_algorithm}.",
                f"{toml_set('speculative.speculative_algorithm', chr(34) + 'EAGLE' + chr(34))}, or "
                f"{toml_set('memory.enable_elastic_memory_pool', 'false')}",
            )
        )
    if spec.speculative_topk != 1:
        out.append(
            _f(
                "error",
                "ELASTIC_SPEC_UNSUPPORTED",
                CONFIG,
                "speculative.speculative_topk",
                "the elastic memory pool supports only a linear draft chain (topk 1), not speculative_topk "
                f"= {spec.speculative_topk}: tree verify moves accepted tokens one at a time, which "
                "page-granular elastic moves cannot express.",
                toml_set("speculative.speculative_topk", "1"),
            )
        )
    backend = cfg.config.extra_engine_args.get("disaggregation-transfer-backend", "mooncake")
    if cfg.config.pd.enable_pd_disaggregation and backend == "mooncake":
        out.append(
            _f(
                "error",
                "ELASTIC_PD_SPEC",
                CONFIG,
                "memory.enable_elastic_memory_pool",
                "the elastic memory pool with PD disaggregation does not support speculative decoding over "
                "the Mooncake transfer backend (SGLang 0.5.23).",
                f"{toml_set('memory.enable_elastic_memory_pool', 'false')}, or turn speculative decoding off",
            )
        )
    return out


def rule_engine_flags(cfg: HybridConfig, engine_version: str | None = None, engine: str | None = None) -> list[Finding]:
    """UNKNOWN_ENGINE_FLAG / ENGINE_FLAG_VALUE / ENGINE_FLAG_SHADOWS_KEY for [extra_engine_args]."""

    return check_extra_engine_args(cfg, engine_version, engine)


def rule_literal_secrets(cfg: HybridConfig, engine_version: str | None = None) -> list[Finding]:
    """LITERAL_SECRET over the loaded values (check_files scans the raw files, unknown keys included)."""

    out = []
    for file, data in ((CONFIG, cfg.config.model_dump()), (SETTINGS, cfg.settings.model_dump())):
        for hit in scan_for_secrets(data):
            dotted = ".".join(hit.path)
            out.append(
                _f(
                    "error",
                    "LITERAL_SECRET",
                    file,
                    dotted,
                    f"`{dotted}` holds {hit.kind} ({hit.length} characters, not shown).",
                    f"remove it from {file}; export it in an environment variable and name that variable in "
                    '"api_key_env" of settings.json.',
                )
            )
    return out


RULES: tuple[Rule, ...] = (
    rule_prefix_cache,
    rule_page_size,
    rule_speculative,
    rule_pd,
    rule_elastic,
)


def effective_engine(cfg: HybridConfig, engine: str | None = None, auto_engine: str | None = None) -> str | None:
    """The engine the rules check against: `engine` (a --engine flag), else [server] engine, with "auto" resolved
    to `auto_engine` (what this host would run: launch's own choice); None when still unresolved."""
    requested = engine or cfg.config.server.engine
    if requested == "auto":
        return auto_engine
    return requested


def check_rules(
    cfg: HybridConfig,
    engine_version: str | None = None,
    *,
    include_secrets: bool = True,
    engine: str | None = None,
) -> list[Finding]:
    """All rule findings for `cfg`; `engine_version` (e.g. "0.5.23") selects SGLang's flag table and gates.

    `engine`: the engine that would serve (sglang | builtin), resolved by the caller; None: [server] engine,
    and for "auto" only the rules both engines share."""
    resolved = engine if engine is not None else effective_engine(cfg)
    findings = [f for rule in RULES for f in rule(cfg, engine_version)]
    findings += rule_server(cfg, resolved) + rule_spec_tree(cfg, resolved) + rule_builtin(cfg, resolved)
    findings += rule_engine_flags(cfg, engine_version, resolved)
    # The target SGLang release's flags, values and silent changes: unless the config pins the bundled
    # runtime, also for auto (it may run SGLang on the GPU host it is meant for).
    findings += rule_release(cfg, engine_version)
    if resolved == "builtin" and not any(f.severity == "error" for f in findings):
        findings += rule_builtin_parser(cfg)  # the runtime's own parser: what no key rule above names
    if include_secrets:
        findings += rule_literal_secrets(cfg, engine_version)
    return findings
