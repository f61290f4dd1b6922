"""BUILTIN_UNSUPPORTED: what the bundled runtime (engine = "builtin") refuses or does not implement."""

from __future__ import annotations

import contextlib
import io
import re

from hybridctl.config.findings import CONFIG, SETTINGS, Finding, json_set, toml_set
from hybridctl.config.findings import rule_finding as _f
from hybridctl.config.schema import HybridConfig
from hybridctl.launch.builtin_flags import RUNTIME_FLAGS
from hybridctl.launch.command import add_extra_args, flags_to_argv
from hybridctl.launch.translate import LaunchError, translate
from hybridshared.flags.runtime_parser import parse_args

BUILTIN_SCHEDULE_POLICIES = ("fcfs", "lpm")


def rule_builtin(cfg: HybridConfig, engine: str | None = None) -> list[Finding]:
    """BUILTIN_UNSUPPORTED: what the bundled runtime does not implement (`engine`: the resolved engine)."""
    if engine != "builtin":
        return []
    out = _settings_findings(cfg)
    for key, bad, good, why in _refused_config_keys(cfg):
        if bad:
            out.append(
                _f(
                    "error",
                    "BUILTIN_UNSUPPORTED",
                    CONFIG,
                    key,
                    f'the bundled runtime (engine = "builtin") would refuse to start: {why}.',
                    f'{toml_set(key, good)}, or set engine = "sglang" in [server] of {CONFIG}',
                )
            )
    return out


def _settings_findings(cfg: HybridConfig) -> list[Finding]:
    """settings.json values the runtime does not implement (a schedule policy) or refuses (chunk size 0)."""
    out = []
    policy = cfg.settings.runtime.schedule_policy
    if policy not in BUILTIN_SCHEDULE_POLICIES:
        out.append(
            _f(
                "error",
                "BUILTIN_UNSUPPORTED",
                SETTINGS,
                "runtime.schedule_policy",
                f'schedule_policy "{policy}" is not implemented by the bundled runtime (engine = "builtin"), '
                f"which schedules {' or '.join(BUILTIN_SCHEDULE_POLICIES)}.",
                json_set("runtime.schedule_policy", '"lpm"') + ' (or set engine = "sglang" in [server] of config.toml)',
            )
        )
    if cfg.settings.runtime.chunked_prefill_size == 0:
        out.append(
            _f(
                "error",
                "BUILTIN_UNSUPPORTED",
                SETTINGS,
                "runtime.chunked_prefill_size",
                'chunked_prefill_size = 0: the bundled runtime (engine = "builtin") refuses it; use a '
                "positive chunk, or -1 to disable chunking.",
                json_set("runtime.chunked_prefill_size", "8192") + " (or -1)",
            )
        )
    return out


def _refused_config_keys(cfg: HybridConfig) -> list[tuple[str, bool, str, str]]:
    """(key, refused?, a value it takes, why) for config.toml keys; the runtime's parser and pool set-up refuse
    them."""
    return [
        (
            "server.tp_size",
            cfg.config.server.tp_size != 1,
            "1",
            "it runs on one device, so tp_size must be 1",
        ),
        (
            "cache.mamba_radix_cache_strategy",
            cfg.config.cache.mamba_radix_cache_strategy == "extra_buffer_lazy",
            '"extra_buffer"',
            "extra_buffer_lazy needs the overlap schedule, which it does not have",
        ),
        (
            "speculative.speculative_algorithm",
            cfg.config.speculative.speculative_algorithm == "EAGLE3",
            '"NEXTN"',
            "it drafts with NGRAM, STANDALONE or the checkpoint's MTP layer (NEXTN/EAGLE), not EAGLE3 heads",
        ),
        (
            "speculative.speculative_topk",
            cfg.speculative_enabled and cfg.config.speculative.speculative_topk != 1,
            "1",
            "it verifies chain drafts only (topk 1), not draft trees",
        ),
        (
            "memory.enable_elastic_memory_pool",
            cfg.config.memory.enable_elastic_memory_pool and cfg.speculative_enabled,
            "false",
            "its speculative decoding keeps the draft state sandbox outside the elastic buffer, so the elastic "
            "pool and speculative decoding cannot run together (runtime/engine/engine_core.py)",
        ),
        (
            "cache.mamba_track_interval",
            cfg.config.cache.mamba_track_interval % cfg.config.cache.radix_cache_page_size != 0,
            str(
                max(1, cfg.config.cache.mamba_track_interval // cfg.config.cache.radix_cache_page_size)
                * cfg.config.cache.radix_cache_page_size
            ),
            "mamba_track_interval must be a multiple of radix_cache_page_size, prefix cache on or off",
        ),
        (
            "extra_engine_args.engine-process",
            cfg.config.pd.enable_pd_disaggregation
            and cfg.config.extra_engine_args.get("engine-process") not in (None, False),
            "false",
            "PD's transfers run on the engine thread of the server's own process, so the runtime's "
            "--engine-process and PD cannot run together (runtime/preflight.py)",
        ),
    ]


def rule_builtin_parser(cfg: HybridConfig) -> list[Finding]:
    """BUILTIN_REFUSES: the bundled runtime's own argument parser, run on the command launch would start.

    The key rules above name what they know; this backstop keeps validate and the runtime one truth for the rest
    (an [extra_engine_args] value out of the runtime's range, a type argparse refuses). The parser lives in the
    shared layer (hybridshared/flags/runtime_parser.py), so the control plane runs it without the runtime;
    preflight (the model directory) is left to the key rules, which read relative paths next to config.toml as
    launch does.
    """

    try:
        translation = translate(cfg, "builtin")
        add_extra_args(translation, cfg.config.extra_engine_args, RUNTIME_FLAGS, "the bundled runtime")
    except LaunchError:
        return []  # the extra-args and ignored-key rules name these
    # Whether the key's variable is set is the launching host's environment, not the files: not judged here.
    translation.flags.pop("--api-key-env", None)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parse_args(flags_to_argv(translation.flags))
    except SystemExit:
        message = stderr.getvalue().strip().split("error: ", 1)[-1]
    else:
        return []
    flag = re.search(r"--[a-z0-9][a-z0-9-]*", message)
    source = translation.sources.get(flag.group(0), "") if flag else ""
    if source.startswith(f"{CONFIG} [extra_engine_args] "):
        file, key = CONFIG, "extra_engine_args." + source.rsplit(" ", 1)[1]
    elif ":" in source:
        file, key = source.split(":", 1)
    else:
        file, key = CONFIG, "extra_engine_args"
    return [
        _f(
            "error",
            "BUILTIN_REFUSES",
            file,
            key,
            f'the bundled runtime (engine = "builtin") would refuse to start: {message}',
            f'correct `{key}` in {file}, or set engine = "sglang" in [server] of {CONFIG}',
        )
    ]
