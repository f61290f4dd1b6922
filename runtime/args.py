"""Command line of `python -m runtime`: SGLang 0.5.23's flag names and meanings, plus the runtime's own few.

Flags SGLang has but the runtime does not implement are refused by name (from the SGLang flag table that
hybridctl ships), so a command line written for SGLang fails loudly here instead of being half-understood.
This module does not import torch: parsing and checking the command line is instant.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from decimal import Decimal
from typing import NoReturn

from runtime.core.config import DEFAULT_TORCH_COMPILE_MAX_BS, DEFAULT_TORCH_COMPILE_MAX_EXTEND_TOKENS
from runtime.core.spec_config import ALGORITHMS

PROG = "python -m runtime"

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
DEVICES = ("auto", "cpu", "cuda")
MAMBA_SSM_DTYPES = ("float32", "bfloat16", "float16")
MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
SCHEDULE_POLICIES = ("fcfs", "lpm")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
TOOL_CALL_PARSERS = ("qwen25", "qwen", "hermes", "qwen3_coder", "kimi_k2")  # tool_calls.py checks it has these
REASONING_PARSERS = ("qwen3", "qwen3-thinking", "deepseek-r1", "nemotron_3", "kimi", "kimi_k2")  # and reasoning.py
SPEC_ALGORITHMS = ALGORITHMS  # runtime/core/spec_config.py: no torch there, parsing stays instant

# The runtime's own flags: seed keys SGLang has no flag for (SGLang builds these behaviours into its cache).
RUNTIME_ONLY_FLAGS = (
    "--memory-budget-gib",
    "--disable-state-snapshot-on-match",
    "--disable-state-copy-on-write",
    "--disable-dual-lru-eviction",
    "--log-mamba-state-stats",
    "--num-threads",
    "--disable-mamba-state-sandbox",
    "--enable-elastic-memory-pool",
    "--elastic-realloc-timeout-s",
    "--torch-compile-max-extend-tokens",
    "--api-key-env",
    "--max-request-body-bytes",
)
DISAGGREGATION_MODES = ("null", "prefill", "decode")
GRAMMAR_BACKENDS = ("llguidance", "none")  # SGLang also has xgrammar (its default) and outlines


@dataclass
class RuntimeArgs:
    """Every launch option after parsing; None means "derive it" exactly as SGLang's None does."""

    model_path: str
    tokenizer_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "auto"
    device: str = "auto"
    page_size: int | None = None
    disable_radix_cache: bool = False
    mem_fraction_static: float | None = None
    mamba_full_memory_ratio: float | None = None
    max_mamba_cache_size: int | None = None
    mamba_ssm_dtype: str | None = None
    mamba_radix_cache_strategy: str = "auto"
    mamba_track_interval: int | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    schedule_policy: str = "fcfs"
    log_level: str = "info"
    log_requests: bool = False
    enable_metrics: bool = False
    api_key: str | None = None  # from --api-key-env (or SGLang's --api-key); never logged nor reported
    api_key_env: str | None = None
    max_request_body_bytes: int | None = None  # None: sized from the context length (server/limits.py)
    trust_remote_code: bool = False
    tp_size: int = 1
    random_seed: int | None = None
    served_model_name: str | None = None
    context_length: int | None = None
    disable_overlap_schedule: bool = False
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = DEFAULT_TORCH_COMPILE_MAX_BS
    torch_compile_max_extend_tokens: int = DEFAULT_TORCH_COMPILE_MAX_EXTEND_TOKENS
    memory_budget_gib: float | None = None
    disable_state_snapshot_on_match: bool = False
    disable_state_copy_on_write: bool = False
    disable_dual_lru_eviction: bool = False
    log_mamba_state_stats: bool = False
    num_threads: int | None = None
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    disable_mamba_state_sandbox: bool = False
    disaggregation_mode: str = "null"
    disaggregation_bootstrap_port: int = 8998
    enable_elastic_memory_pool: bool = False
    elastic_realloc_timeout_s: float = 5.0
    tool_call_parser: str | None = None  # runtime/server/tool_calls.py
    reasoning_parser: str | None = None  # runtime/server/reasoning.py
    grammar_backend: str = "llguidance"  # structured output (runtime/scheduler/grammar.py); "none": refused
    constrained_json_disable_any_whitespace: bool = False  # JSON schemas: compact separators only
    constrained_json_whitespace_pattern: str | None = None  # JSON schemas: whitespace matches this regex

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


def human_readable_int(value: str) -> int:
    """SGLang's integer syntax for token counts: 4096, 25.6k, 1M (SI) or 8Ki (IEC)."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
        si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"decimals are not allowed with IEC suffixes like '{suffix}'"
                )
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {value!r} (examples: 4096, 32k, 8Ki)") from None


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def _non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {number}")
    return number


def _fraction(value: str) -> float:
    number = float(value)
    if not 0.0 < number < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {number}")
    return number


def _positive_float(value: str) -> float:
    number = float(value)
    if not number > 0.0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {number}")
    return number


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not the 30-line usage block: the message already names the flag and the fix.
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="The bundled hybrid-model runtime behind SGLang 0.5.23's HTTP API (SGLang's flag names).",
        allow_abbrev=False,  # SGLang's parser would read --model as --model-path; only exact names are taken
    )
    _add_sglang_flags(p)
    _add_spec_and_pd_flags(p)
    _add_own_flags(p)
    return p


def _add_sglang_flags(p: argparse.ArgumentParser) -> None:
    """SGLang's own server flags, with its names."""
    p.add_argument("--model-path", "--model", dest="model_path", required=True, help="Model directory.")
    p.add_argument("--tokenizer-path", help="Tokenizer directory (default: the model directory).")
    p.add_argument("--host", default="127.0.0.1", help="Bind address (default 127.0.0.1, loopback only).")
    p.add_argument("--port", type=int, default=30000, help="HTTP port (default 30000).")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="Weight and activation dtype.")
    p.add_argument(
        "--device", default="auto", choices=DEVICES, help="cpu, cuda, or auto (cuda when available)."
    )
    p.add_argument("--page-size", type=_positive_int, help="Tokens per KV page (default 1).")
    p.add_argument("--disable-radix-cache", action="store_true", help="Turn the prefix cache off.")
    p.add_argument("--mem-fraction-static", type=_fraction, help="Fraction of memory for weights and pools.")
    p.add_argument(
        "--mamba-full-memory-ratio", type=_positive_float, help="State-pool bytes per KV byte (0.9)."
    )
    p.add_argument("--max-mamba-cache-size", type=_positive_int, help="Number of recurrent-state slots.")
    p.add_argument("--mamba-ssm-dtype", choices=MAMBA_SSM_DTYPES, help="dtype of the SSM state.")
    p.add_argument("--mamba-radix-cache-strategy", default="auto", choices=MAMBA_STRATEGIES)
    p.add_argument("--mamba-track-interval", type=_positive_int, help="Tokens between state checkpoints.")
    p.add_argument("--max-running-requests", type=_positive_int)
    p.add_argument("--max-total-tokens", type=human_readable_int, help="Cap on the KV pool in tokens.")
    p.add_argument(
        "--chunked-prefill-size", type=int, help="Max prompt tokens per prefill step; -1 disables."
    )
    p.add_argument("--schedule-policy", default="fcfs", help="fcfs or lpm.")
    p.add_argument("--log-level", default="info", type=str.lower, choices=LOG_LEVELS)
    p.add_argument("--log-requests", action="store_true", help="Log every request's metadata.")
    p.add_argument("--enable-metrics", action="store_true", help="Serve Prometheus metrics at /metrics.")
    p.add_argument(
        "--api-key",
        help="Require 'Authorization: Bearer <key>' on all routes but health/ready/metrics. Visible to every "
        "local user in ps: prefer --api-key-env.",
    )
    p.add_argument(
        "--trust-remote-code", action="store_true", help="Accepted; the runtime runs no model code."
    )
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1, help="Only 1.")
    p.add_argument("--random-seed", type=int)
    p.add_argument("--served-model-name", help="Model name in the OpenAI API (default: the model path).")
    p.add_argument(
        "--grammar-backend",
        default="llguidance",
        help="Structured-output engine: llguidance (default here) or none. SGLang's xgrammar and outlines are "
        "not bundled.",
    )
    p.add_argument(
        "--constrained-json-disable-any-whitespace",
        action="store_true",
        help="JSON-schema output: no free whitespace between tokens.",
    )
    p.add_argument("--constrained-json-whitespace-pattern", help="JSON-schema output: regex for whitespace.")
    p.add_argument(
        "--context-length", type=human_readable_int, help="Max tokens per request (prompt + output)."
    )
    p.add_argument(
        "--disable-overlap-schedule", action="store_true", help="Accepted: the runtime never overlaps."
    )
    p.add_argument(
        "--enable-torch-compile",
        action="store_true",
        help="torch.compile the decode forward and short extends (compiles at start).",
    )
    # The formats the runtime parses (runtime/server/tool_calls.py, reasoning.py); other SGLang names: exit 2.
    p.add_argument("--tool-call-parser", choices=TOOL_CALL_PARSERS, help="Tool-call format of the model's output.")
    p.add_argument("--reasoning-parser", choices=REASONING_PARSERS, help="Think-block format of the model's output.")
    p.add_argument(
        "--torch-compile-max-bs", type=_positive_int,
        default=DEFAULT_TORCH_COMPILE_MAX_BS,
        help=f"Largest compiled decode batch ({DEFAULT_TORCH_COMPILE_MAX_BS})."
    )


def _add_spec_and_pd_flags(p: argparse.ArgumentParser) -> None:
    spec = p.add_argument_group("speculative decoding (runtime/spec)")
    spec.add_argument(
        "--speculative-algorithm", type=str.upper, choices=SPEC_ALGORITHMS, help="Draft source; off if unset."
    )
    spec.add_argument(
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        dest="speculative_draft_model_path",
        help="Draft model directory (STANDALONE).",
    )
    spec.add_argument("--speculative-num-steps", type=_positive_int, help="Drafts per verify round (3).")
    spec.add_argument("--speculative-eagle-topk", type=_positive_int, help="Draft tree width; only 1.")
    spec.add_argument(
        "--speculative-num-draft-tokens", type=_positive_int, help="Tokens per verify forward (steps + 1)."
    )
    pd = p.add_argument_group("prefill/decode disaggregation (runtime/pd)")
    pd.add_argument(
        "--disaggregation-mode", default="null", choices=DISAGGREGATION_MODES, help="null, prefill or decode."
    )
    pd.add_argument(
        "--disaggregation-bootstrap-port", type=int, default=8998, help="Prefill: KV/state transfer port."
    )


def _add_own_flags(p: argparse.ArgumentParser) -> None:
    """The bundled runtime's flags that SGLang lacks."""
    own = p.add_argument_group("bundled-runtime flags (no SGLang equivalent)")
    own.add_argument(
        "--memory-budget-gib", type=_positive_float, help="Memory treated as the device's (4 GiB)."
    )
    own.add_argument(
        "--disable-state-snapshot-on-match", action="store_true", help="No state reuse on a hit."
    )
    own.add_argument(
        "--disable-state-copy-on-write", action="store_true", help="Allow in-place cached states."
    )
    own.add_argument("--disable-dual-lru-eviction", action="store_true", help="One LRU for KV and states.")
    own.add_argument(
        "--log-mamba-state-stats", action="store_true", help="Log state-pool stats periodically."
    )
    own.add_argument("--num-threads", type=_positive_int, help="torch CPU threads.")
    own.add_argument(
        "--disable-mamba-state-sandbox",
        action="store_true",
        help="No per-draft state slots (speculative decoding then refuses to start).",
    )
    own.add_argument(
        "--enable-elastic-memory-pool",
        "--enable-unified-memory",
        dest="enable_elastic_memory_pool",
        action="store_true",
        help="Move pages between the KV and state pools at run time (SGLang: --enable-unified-memory).",
    )
    own.add_argument(
        "--elastic-realloc-timeout-s", type=_positive_float, default=5.0, help="Deadline of one move (5)."
    )
    own.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="Read the API key from environment variable NAME (the key never appears on the command line).",
    )
    own.add_argument(
        "--max-request-body-bytes",
        type=human_readable_int,
        help="Largest request body; larger ones get 413 (default: sized from the context length).",
    )
    own.add_argument(
        "--torch-compile-max-extend-tokens",
        type=_non_negative_int,
        default=DEFAULT_TORCH_COMPILE_MAX_EXTEND_TOKENS,
        help=f"With --enable-torch-compile: longest one-sequence extend run compiled "
        f"({DEFAULT_TORCH_COMPILE_MAX_EXTEND_TOKENS}; 0: extends stay eager).",
    )

def _sglang_option_strings() -> set[str]:
    from hybridctl.config.engine_flags import sglang_flags

    names: set[str] = set()
    for info in sglang_flags().values():
        names.add(info.name)
        names.update(info.aliases)
    return names


def _refuse_unimplemented_sglang_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    ours = set(parser._option_string_actions)  # noqa: SLF001 - argparse's own index of the option strings
    sglang = _sglang_option_strings()
    for token in argv:
        if token == "--":
            break
        if not token.startswith("--"):
            continue
        name = token.split("=", 1)[0]
        if name not in ours and name in sglang:
            parser.error(f"{name} is an SGLang flag the bundled runtime does not implement")


def parse_args(argv: Sequence[str] | None = None) -> RuntimeArgs:
    """Parse and check a command line; bad input exits 2 with one clear message (argparse's convention)."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    _refuse_unimplemented_sglang_flags(parser, argv)
    ns = parser.parse_args(argv)
    if ns.tp_size != 1:
        parser.error(f"--tp-size {ns.tp_size}: the bundled runtime runs on one device; use --tp-size 1")
    if ns.schedule_policy not in SCHEDULE_POLICIES:
        parser.error(
            f"--schedule-policy {ns.schedule_policy}: the bundled runtime implements "
            f"{', '.join(SCHEDULE_POLICIES)}"
        )
    if ns.chunked_prefill_size is not None and (ns.chunked_prefill_size == 0 or ns.chunked_prefill_size < -1):
        parser.error(
            f"--chunked-prefill-size {ns.chunked_prefill_size}: use a positive number, or -1 to disable"
        )
    if ns.grammar_backend not in GRAMMAR_BACKENDS:
        parser.error(
            f"--grammar-backend {ns.grammar_backend}: the bundled runtime's grammar engine is llguidance "
            + (
                "(SGLang's xgrammar and outlines are not bundled: xgrammar's Linux wheel requires triton); "
                if ns.grammar_backend in ("xgrammar", "outlines")
                else ""
            )
            + f"use --grammar-backend {' or '.join(GRAMMAR_BACKENDS)}"
        )
    if ns.port < 0 or ns.port > 65535:
        parser.error(f"--port {ns.port}: must be in 0..65535")
    if not 0 <= ns.disaggregation_bootstrap_port <= 65535:
        parser.error(f"--disaggregation-bootstrap-port {ns.disaggregation_bootstrap_port}: must be 0..65535")
    if ns.api_key_env is not None:
        if ns.api_key is not None:
            parser.error("--api-key and --api-key-env: give one (prefer --api-key-env: argv is public)")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ns.api_key_env):
            parser.error(f"--api-key-env {ns.api_key_env!r}: give the NAME of an environment variable")
        ns.api_key = os.environ.get(ns.api_key_env) or None
        if ns.api_key is None:
            parser.error(
                f"--api-key-env {ns.api_key_env}: that environment variable is unset or empty; "
                f"export {ns.api_key_env}=<key> before starting the server"
            )
    if ns.max_request_body_bytes is not None and ns.max_request_body_bytes < 1024:
        parser.error(f"--max-request-body-bytes {ns.max_request_body_bytes}: must be >= 1024")
    known = {f.name for f in fields(RuntimeArgs)}
    return RuntimeArgs(**{k: v for k, v in vars(ns).items() if k in known})
