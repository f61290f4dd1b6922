"""Config -> `python -m runtime ...`, the bundled runtime's command line (SGLang's flag names, plus its own).

`RUNTIME_FLAGS` is the runtime's accepted flag set as hybridctl knows it; a control test compares it with the
runtime's real parser (runtime/args.py) so the two cannot drift.
"""

from __future__ import annotations

import sys

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.command import (
    EngineCommand,
    FlagSpec,
    add_extra_args,
    flags_to_argv,
    require_model_path,
)
from hybridctl.launch.translate import refuse_ignored, translate

_VALUE_FLAGS = (
    "--model-path", "--tokenizer-path", "--host", "--port", "--dtype", "--device", "--page-size",
    "--mem-fraction-static", "--mamba-full-memory-ratio", "--max-mamba-cache-size", "--mamba-ssm-dtype",
    "--mamba-radix-cache-strategy", "--mamba-track-interval", "--max-running-requests", "--max-total-tokens",
    "--chunked-prefill-size", "--schedule-policy", "--log-level", "--api-key", "--tp-size", "--random-seed",
    "--served-model-name", "--context-length", "--memory-budget-gib", "--num-threads",
    "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
    "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--disaggregation-mode",
    "--disaggregation-bootstrap-port", "--elastic-realloc-timeout-s", "--torch-compile-max-bs",
    "--torch-compile-max-extend-tokens", "--api-key-env", "--max-request-body-bytes", "--grammar-backend",
    "--constrained-json-whitespace-pattern", "--tool-call-parser", "--reasoning-parser", "--native-decode",
    "--decoding-step-tokens",
)  # fmt: skip
_SWITCHES = (
    "--disable-radix-cache", "--log-requests", "--enable-metrics", "--trust-remote-code",
    "--disable-overlap-schedule", "--disable-state-snapshot-on-match", "--disable-state-copy-on-write",
    "--disable-dual-lru-eviction", "--log-mamba-state-stats", "--disable-mamba-state-sandbox",
    "--enable-elastic-memory-pool", "--enable-torch-compile", "--constrained-json-disable-any-whitespace",
    "--engine-process",
    "--torch-compile-in-background",
    "--enable-mixed-chunk", "--disable-mixed-chunk",
)  # fmt: skip
_CHOICES = {
    "--dtype": ("auto", "half", "float16", "bfloat16", "float", "float32"),
    "--device": ("auto", "cpu", "cuda"),
    "--native-decode": ("auto", "on", "off"),
    "--schedule-policy": ("fcfs", "lpm"),
    "--speculative-algorithm": ("NGRAM", "STANDALONE", "NEXTN", "EAGLE"),
    "--disaggregation-mode": ("null", "prefill", "decode"),
    "--grammar-backend": ("llguidance", "none"),
    "--tool-call-parser": ("qwen25", "qwen", "hermes", "qwen3_coder", "kimi_k2"),
    "--reasoning-parser": ("qwen3", "qwen3-thinking", "deepseek-r1", "nemotron_3", "kimi", "kimi_k2"),
}

RUNTIME_FLAGS: dict[str, FlagSpec] = {
    **{name: FlagSpec(name, True, _CHOICES.get(name, ())) for name in _VALUE_FLAGS},
    **{name: FlagSpec(name, False) for name in _SWITCHES},
}


def builtin_command(cfg: HybridConfig, python: str | None = None, allow_ignored: bool = False) -> EngineCommand:
    """The bundled runtime's command for `cfg`.

    Raises LaunchError for keys it would ignore (unless allowed) and for bad `extra_engine_args`.
    """
    require_model_path(cfg)
    translation = translate(cfg, "builtin")
    refuse_ignored(translation, allow_ignored)
    add_extra_args(translation, cfg.config.extra_engine_args, RUNTIME_FLAGS, "the bundled runtime")
    server = cfg.config.server
    argv = [python or sys.executable, "-m", "runtime", *flags_to_argv(translation.flags)]
    return EngineCommand(
        engine="builtin", role="server", argv=argv, host=server.host, port=server.port,
        ignored=translation.ignored,
    )  # fmt: skip
