"""The parser of `python -m runtime`, generated from `RuntimeArgs` (hybridshared/flags/runtime_args.py), and the
checks one flag's type cannot make.

Flags SGLang has but the runtime does not implement are refused by name (from the SGLang flag table in
hybridshared/data), so a command line written for SGLang fails loudly here instead of being half-understood.
`hybridctl validate` runs this same parser on the command launch would start, so this module stays torch-free.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, NoReturn

from hybridshared.flags.engine_flags import sglang_flags
from hybridshared.flags.fields import add_flags
from hybridshared.flags.runtime_args import GRAMMAR_BACKENDS, PROG, SCHEDULE_POLICIES, RuntimeArgs


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
    add_flags(p, RuntimeArgs)
    return p


def _sglang_option_strings() -> set[str]:
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


def _check_values(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """What argparse's per-flag types cannot say: ranges with their own message, and what the runtime lacks."""
    if ns.tp_size != 1:
        parser.error(f"--tp-size {ns.tp_size}: the bundled runtime runs on one device; use --tp-size 1")
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
    if ns.schedule_policy not in SCHEDULE_POLICIES:
        parser.error(
            f"--schedule-policy {ns.schedule_policy}: the bundled runtime implements {', '.join(SCHEDULE_POLICIES)}"
        )
    if ns.chunked_prefill_size is not None and (ns.chunked_prefill_size == 0 or ns.chunked_prefill_size < -1):
        parser.error(f"--chunked-prefill-size {ns.chunked_prefill_size}: use a positive number, or -1 to disable")
    steps = ns.decoding_step_tokens
    if isinstance(steps, int) and (steps == 0 or steps < -1):
        parser.error(f"--decoding-step-tokens {ns.decoding_step_tokens}: use a positive number, auto, or -1 for no cap")
    if ns.enable_mixed_chunk and ns.disable_mixed_chunk:
        parser.error("--enable-mixed-chunk and --disable-mixed-chunk: give one")
    if ns.port < 0 or ns.port > 65535:
        parser.error(f"--port {ns.port}: must be in 0..65535")
    if not 0 <= ns.disaggregation_bootstrap_port <= 65535:
        parser.error(f"--disaggregation-bootstrap-port {ns.disaggregation_bootstrap_port}: must be 0..65535")


def _read_api_key_env(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """--api-key-env NAME: the key comes from the environment, so it never shows in `ps`."""
    if ns.api_key_env is None:
        return
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


def parse_args(argv: Sequence[str] | None = None) -> RuntimeArgs:
    """Parse and check a command line; bad input exits 2 with one clear message (argparse's convention)."""

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    _refuse_unimplemented_sglang_flags(parser, argv)
    ns = parser.parse_args(argv)
    _check_values(parser, ns)
    _read_api_key_env(parser, ns)
    if ns.api_key is not None and not (ns.api_key.isascii() and ns.api_key.isprintable()):
        # No client could send it: an HTTP header carries printable ASCII (httpx and requests refuse the rest).
        parser.error(
            "--api-key: the key holds non-ASCII or control characters, which an 'Authorization: Bearer' header "
            "cannot carry; use printable ASCII (e.g. `openssl rand -hex 32`)"
        )
    if ns.max_request_body_bytes is not None and ns.max_request_body_bytes < 1024:
        parser.error(f"--max-request-body-bytes {ns.max_request_body_bytes}: must be >= 1024")
    known: dict[str, Any] = {f.name: getattr(ns, f.name) for f in fields(RuntimeArgs)}
    return RuntimeArgs(**known)
