"""Command line of `python -m runtime`: SGLang 0.5.23's flag names and meanings, plus the runtime's own few.

`RuntimeArgs` is the one source of the options: each field's metadata (hybridshared/flags/fields.py) is its flag (names,
help, type, choices), so the parser (hybridshared/flags/runtime_parser.py) is generated from it, and says which
`EngineArgs` option the field sets, so the engine's options are derived from it (runtime/core/config.py
`engine_args`). Adding a flag is adding one field here.

This module does not import torch: parsing and checking the command line is instant.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass

from hybridshared.flags.fields import flag, group_flags
from hybridshared.flags.flag_types import (
    fraction,
    human_readable_int,
    non_negative_int,
    positive_float,
    positive_int,
    step_tokens,
)

PROG = "python -m runtime"

DEFAULT_TORCH_COMPILE_MAX_BS = 32  # SGLang's --torch-compile-max-bs default
NATIVE_DECODE_MODES = ("auto", "on", "off")  # --native-decode (runtime/engine/native_decode.py)
DEFAULT_TORCH_COMPILE_MAX_EXTEND_TOKENS = 128  # the runtime's own (runtime/engine/compiled_extend.py)
# On CPU, while requests decode, a step computes at most the tokens that keep it within a pause target
# (--decoding-step-tokens auto, the CPU default; runtime/scheduler/step_budget.py), so a long prompt arriving then
# pauses a decoding stream for one such step, not for its whole prefill (benchmarks/mixed_batching.py). Until the
# engine has timed a prefill, and with a fixed cap, this many. Elsewhere no cap but chunked_prefill_size (a GPU
# computes a long chunk in milliseconds).
DEFAULT_CPU_DECODING_STEP_TOKENS = 256
# The longest a decoding stream should stall for another request's prefill under --decoding-step-tokens auto: a
# reader takes about 180 ms per token (250 words a minute, ~1.3 tokens a word), so a shorter stall is not seen in
# a stream read as it arrives; steps overshoot the estimate by up to a third (195 ms at a 150 ms target on the
# demo model), hence 100. The budget's floor: runtime/scheduler/step_budget.py MIN_TOKENS, 256 (or SMALL_MIN_TOKENS).
DEFAULT_DECODE_PAUSE_TARGET_MS = 100.0
# On CPU a prefill step admits another prompt only while the step stays within this many prompt tokens (SGLang's
# --max-prefill-tokens; its default elsewhere). A CPU forward's cost grows linearly with its tokens from a few
# dozen on, so batching prompts that arrive together saves nothing and makes every one of them wait for all:
# prefilled one after another, the first answer comes after its own prompt (the peers harness's 4x4 shared-prefix
# workload: mean TTFT -30%).
DEFAULT_CPU_MAX_PREFILL_TOKENS = 128
DEFAULT_MAX_PREFILL_TOKENS = 16384  # SGLang's --max-prefill-tokens default

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
DEVICES = ("auto", "cpu", "cuda")
MAMBA_SSM_DTYPES = ("float32", "bfloat16", "float16")
MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
SCHEDULE_POLICIES = ("fcfs", "lpm")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
TOOL_CALL_PARSERS = ("qwen25", "qwen", "hermes", "qwen3_coder", "kimi_k2")  # tool_calls.py checks it has these
REASONING_PARSERS = ("qwen3", "qwen3-thinking", "deepseek-r1", "nemotron_3", "kimi", "kimi_k2")  # and reasoning.py
SPEC_ALGORITHMS = ("NGRAM", "STANDALONE", "EAGLE", "NEXTN")  # runtime/core/speculative_config.py resolves them
DISAGGREGATION_MODES = ("null", "prefill", "decode")
GRAMMAR_BACKENDS = ("llguidance", "none")  # SGLang also has xgrammar (its default) and outlines

SPEC = "speculative decoding (runtime/speculative)"
PD = "prefill/decode disaggregation (runtime/pd)"
OWN = "bundled-runtime flags (no SGLang equivalent)"


def _engine_dtype(dtype: str) -> str:
    return {"half": "float16", "float": "float32"}.get(dtype, dtype)


@dataclass
class RuntimeArgs:
    """Every launch option after parsing; None means "derive it" exactly as SGLang's None does.

    Field order is the order of `--help`. A new flag is one field, e.g. a server-side one:
        tool_call_parser: str | None = flag("--tool-call-parser", choices=(...), help="...", engine=None)
    Without `engine=None` the field sets the `EngineArgs` option of its name (`engine="x"` another name,
    `to_engine` converts); tests/runtime/test_args_options.py fails on a flag the engine does not take. Checks
    that need their own message go in runtime_parser.py's `_check_values`.
    """

    # SGLang's own server flags, with its names.
    model_path: str = flag("--model-path", "--model", required=True, help="Model directory.")
    tokenizer_path: str | None = flag("--tokenizer-path", help="Tokenizer directory (default: the model directory).")
    host: str = flag(
        "--host", default="127.0.0.1", help="Bind address (default 127.0.0.1, loopback only).", engine=None
    )
    port: int = flag("--port", default=30000, type=int, help="HTTP port (default 30000).", engine=None)
    dtype: str = flag(
        "--dtype", default="auto", choices=DTYPES, help="Weight and activation dtype.", to_engine=_engine_dtype
    )
    # The engine gets the resolved device (server/launch.py: auto -> cuda when available), not this one.
    device: str = flag(
        "--device", default="auto", choices=DEVICES, help="cpu, cuda, or auto (cuda when available).", engine=None
    )
    page_size: int | None = flag("--page-size", type=positive_int, help="Tokens per KV page (default 1).")
    disable_radix_cache: bool = flag("--disable-radix-cache", default=False, help="Turn the prefix cache off.")
    mem_fraction_static: float | None = flag(
        "--mem-fraction-static", type=fraction, help="Fraction of memory for weights and pools."
    )
    mamba_full_memory_ratio: float | None = flag(
        "--mamba-full-memory-ratio", type=positive_float, help="State-pool bytes per KV byte (0.9)."
    )
    max_mamba_cache_size: int | None = flag(
        "--max-mamba-cache-size", type=positive_int, help="Number of recurrent-state slots."
    )
    mamba_ssm_dtype: str | None = flag("--mamba-ssm-dtype", choices=MAMBA_SSM_DTYPES, help="dtype of the SSM state.")
    mamba_radix_cache_strategy: str = flag("--mamba-radix-cache-strategy", default="auto", choices=MAMBA_STRATEGIES)
    mamba_track_interval: int | None = flag(
        "--mamba-track-interval", type=positive_int, help="Tokens between state checkpoints."
    )
    max_running_requests: int | None = flag("--max-running-requests", type=positive_int)
    max_total_tokens: int | None = flag(
        "--max-total-tokens", type=human_readable_int, help="Cap on the KV pool in tokens."
    )
    chunked_prefill_size: int | None = flag(
        "--chunked-prefill-size", type=int, help="Max prompt tokens per prefill step; -1 disables."
    )
    # The runtime mixes by default (--disable-mixed-chunk turns it off): SGLang's switch is accepted as is.
    enable_mixed_chunk: bool = flag(
        "--enable-mixed-chunk",
        default=False,
        help="Decode rows ride in prefill steps (one forward for both): the runtime's default.",
        engine=None,
    )
    max_prefill_tokens: int | None = flag(
        "--max-prefill-tokens",
        type=positive_int,
        help=f"A prefill step takes further prompts only while its prompt tokens stay within this (its first "
        f"chunk is never cut by it; default {DEFAULT_CPU_MAX_PREFILL_TOKENS} on CPU, "
        f"{DEFAULT_MAX_PREFILL_TOKENS} elsewhere).",
    )
    schedule_policy: str = flag("--schedule-policy", default="fcfs", help="fcfs or lpm.")  # checked in runtime_parser
    log_level: str = flag("--log-level", default="info", type=str.lower, choices=LOG_LEVELS, engine=None)
    log_requests: bool = flag("--log-requests", default=False, help="Log every request's metadata.", engine=None)
    enable_metrics: bool = flag(
        "--enable-metrics", default=False, help="Serve Prometheus metrics at /metrics.", engine=None
    )
    # Set from --api-key-env too (runtime_parser.parse_args); never logged nor reported.
    api_key: str | None = flag(
        "--api-key",
        help="Require 'Authorization: Bearer <key>' on all routes but health/ready/metrics. Visible to every "
        "local user in ps: prefer --api-key-env.",
        engine=None,
    )
    trust_remote_code: bool = flag(
        "--trust-remote-code", default=False, help="Accepted; the runtime runs no model code.", engine=None
    )
    tp_size: int = flag("--tp-size", "--tensor-parallel-size", default=1, type=int, help="Only 1.", engine=None)
    random_seed: int | None = flag("--random-seed", type=int)
    served_model_name: str | None = flag(
        "--served-model-name",
        help="Model name in the OpenAI API (default: the model path).",
        engine=None,
    )
    # Structured output (runtime/scheduler/grammar.py) is compiled and masked by the server's request path, not
    # configured in the engine.
    grammar_backend: str = flag(
        "--grammar-backend",
        default="llguidance",
        help="Structured-output engine: llguidance (default here) or none. SGLang's xgrammar and outlines are "
        "not bundled.",
        engine=None,
    )
    constrained_json_disable_any_whitespace: bool = flag(
        "--constrained-json-disable-any-whitespace",
        default=False,
        help="JSON-schema output: no free whitespace between tokens.",
        engine=None,
    )
    constrained_json_whitespace_pattern: str | None = flag(
        "--constrained-json-whitespace-pattern", help="JSON-schema output: regex for whitespace.", engine=None
    )
    # The formats the runtime parses (runtime/server/tool_calls.py, reasoning.py); other SGLang names: exit 2.
    tool_call_parser: str | None = flag(
        "--tool-call-parser", choices=TOOL_CALL_PARSERS, help="Tool-call format of the model's output.", engine=None
    )
    reasoning_parser: str | None = flag(
        "--reasoning-parser", choices=REASONING_PARSERS, help="Think-block format of the model's output.", engine=None
    )
    context_length: int | None = flag(
        "--context-length", type=human_readable_int, help="Max tokens per request (prompt + output)."
    )
    disable_overlap_schedule: bool = flag(
        "--disable-overlap-schedule", default=False, help="Accepted: the runtime never overlaps.", engine=None
    )
    enable_torch_compile: bool = flag(
        "--enable-torch-compile",
        default=False,
        help="torch.compile the decode forward and short extends (compiles at start).",
    )
    torch_compile_max_bs: int = flag(
        "--torch-compile-max-bs",
        default=DEFAULT_TORCH_COMPILE_MAX_BS,
        type=positive_int,
        help=f"Largest compiled decode batch ({DEFAULT_TORCH_COMPILE_MAX_BS}).",
    )

    # Speculative decoding and PD disaggregation (SGLang's names).
    speculative_algorithm: str | None = flag(
        "--speculative-algorithm",
        type=str.upper,
        choices=SPEC_ALGORITHMS,
        help="Draft source; off if unset.",
        group=SPEC,
    )
    speculative_draft_model_path: str | None = flag(
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        help="Draft model directory (STANDALONE).",
        group=SPEC,
    )
    speculative_num_steps: int | None = flag(
        "--speculative-num-steps", type=positive_int, help="Drafts per verify round (3).", group=SPEC
    )
    speculative_eagle_topk: int | None = flag(
        "--speculative-eagle-topk", type=positive_int, help="Draft tree width; only 1.", group=SPEC
    )
    speculative_num_draft_tokens: int | None = flag(
        "--speculative-num-draft-tokens",
        type=positive_int,
        help="Tokens per verify forward (steps + 1).",
        group=SPEC,
    )
    disaggregation_mode: str = flag(
        "--disaggregation-mode",
        default="null",
        choices=DISAGGREGATION_MODES,
        help="null, prefill or decode.",
        group=PD,
        engine=None,
    )
    disaggregation_bootstrap_port: int = flag(
        "--disaggregation-bootstrap-port",
        default=8998,
        type=int,
        help="Prefill: KV/state transfer port.",
        group=PD,
        engine=None,
    )

    # The bundled runtime's own flags: seed keys SGLang has no flag for (SGLang builds these into its cache).
    memory_budget_gib: float | None = flag(
        "--memory-budget-gib",
        type=positive_float,
        help="Memory treated as the device's (4 GiB).",
        group=OWN,
    )
    disable_state_snapshot_on_match: bool = flag(
        "--disable-state-snapshot-on-match",
        default=False,
        help="No state reuse on a hit.",
        group=OWN,
        engine="state_snapshot_on_match",
        to_engine=operator.not_,
    )
    disable_state_copy_on_write: bool = flag(
        "--disable-state-copy-on-write",
        default=False,
        help="Allow in-place cached states.",
        group=OWN,
        engine="state_copy_on_write",
        to_engine=operator.not_,
    )
    disable_dual_lru_eviction: bool = flag(
        "--disable-dual-lru-eviction",
        default=False,
        help="One LRU for KV and states.",
        group=OWN,
        engine="dual_lru_eviction",
        to_engine=operator.not_,
    )
    log_mamba_state_stats: bool = flag(
        "--log-mamba-state-stats", default=False, help="Log state-pool stats periodically.", group=OWN
    )
    # Applied by the server process (torch.set_num_threads) before the engine starts.
    num_threads: int | None = flag(
        "--num-threads", type=positive_int, help="torch CPU threads.", group=OWN, engine=None
    )
    disable_mamba_state_sandbox: bool = flag(
        "--disable-mamba-state-sandbox",
        default=False,
        help="No per-draft state slots (speculative decoding then refuses to start).",
        group=OWN,
        engine="enable_mamba_state_sandbox",
        to_engine=operator.not_,
    )
    enable_elastic_memory_pool: bool = flag(
        "--enable-elastic-memory-pool",
        "--enable-unified-memory",
        default=False,
        help="Move pages between the KV and state pools at run time (SGLang: --enable-unified-memory).",
        group=OWN,
    )
    elastic_realloc_timeout_s: float = flag(
        "--elastic-realloc-timeout-s",
        default=5.0,
        type=positive_float,
        help="Deadline of one move (5).",
        group=OWN,
    )
    api_key_env: str | None = flag(
        "--api-key-env",
        metavar="NAME",
        help="Read the API key from environment variable NAME (the key never appears on the command line).",
        group=OWN,
        engine=None,
    )
    # None: sized from the context length (server/limits.py).
    max_request_body_bytes: int | None = flag(
        "--max-request-body-bytes",
        type=human_readable_int,
        help="Largest request body; larger ones get 413 (default: sized from the context length).",
        group=OWN,
        engine=None,
    )
    engine_process: bool = flag(
        "--engine-process",
        default=False,
        help="Run the engine (scheduler, model) in its own process, apart from the HTTP server and tokenizer "
        "(SGLang's layout): the two no longer share one GIL. Not with --disaggregation-mode.",
        group=OWN,
        engine=None,
    )
    torch_compile_max_extend_tokens: int = flag(
        "--torch-compile-max-extend-tokens",
        default=DEFAULT_TORCH_COMPILE_MAX_EXTEND_TOKENS,
        type=non_negative_int,
        help=f"With --enable-torch-compile: longest one-sequence extend run compiled "
        f"({DEFAULT_TORCH_COMPILE_MAX_EXTEND_TOKENS}; 0: extends stay eager).",
        group=OWN,
    )
    torch_compile_in_background: bool = flag(
        "--torch-compile-in-background",
        default=False,
        help="With --enable-torch-compile: healthy and serving eager at once; the compiled forwards are built on a "
        "background thread and used from the step after they are ready (/server_info internal_states "
        "torch_compile says which path runs).",
        group=OWN,
    )
    disable_mixed_chunk: bool = flag(
        "--disable-mixed-chunk",
        default=False,
        help="Prefill and decode steps alternate instead of running in one forward.",
        group=OWN,
        engine="enable_mixed_chunk",
        to_engine=operator.not_,
    )
    decoding_step_tokens: int | str | None = flag(
        "--decoding-step-tokens",
        type=step_tokens,
        help="While requests decode, the most tokens one step computes, decode rows included: a long prompt "
        "pauses a decoding stream for one such step. auto (the CPU default): the prompt tokens the engine "
        "computes in --decode-pause-target-ms beside the decode rows, from its measured step times "
        f"({DEFAULT_CPU_DECODING_STEP_TOKENS} until it has timed a prefill); other devices and -1: "
        "--chunked-prefill-size alone.",
        group=OWN,
    )
    decode_pause_target_ms: float = flag(
        "--decode-pause-target-ms",
        default=DEFAULT_DECODE_PAUSE_TARGET_MS,
        type=positive_float,
        help=f"With --decoding-step-tokens auto: the longest a step should take while requests decode "
        f"(default {DEFAULT_DECODE_PAUSE_TARGET_MS:g}).",
        group=OWN,
    )
    native_decode: str = flag(
        "--native-decode",
        default="auto",
        choices=NATIVE_DECODE_MODES,
        help="Decode steps of Qwen3-Next-family models (fp32, CPU) as one C call, built with the host's C compiler "
        "at first start and cached (auto: where supported, else the torch path and the log says why; on: refuse "
        "to start where it cannot run; off: the torch path). Wins over --enable-torch-compile's decode; "
        "/server_info internal_states native_decode says which path runs.",
        group=OWN,
    )

    @property
    def resolved_tokenizer_path(self) -> str:
        return self.tokenizer_path or self.model_path

    @property
    def resolved_served_model_name(self) -> str:
        return self.served_model_name or self.model_path

    def public_dict(self) -> dict[str, object]:
        """The options as /server_info reports them; the API key is a secret and never leaves the process."""
        out = asdict(self)
        out["api_key"] = None if self.api_key is None else "<redacted>"
        return out


# The runtime's own flags (seed keys SGLang has no flag for); every other flag is SGLang's.
RUNTIME_ONLY_FLAGS = group_flags(RuntimeArgs, OWN)
