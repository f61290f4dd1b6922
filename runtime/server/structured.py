"""Structured output on the server side: the grammar engine for this tokenizer, and each request's constraint
compiled before it reaches the engine (a constraint that does not compile is that request's 400)."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridshared.flags.runtime_args import RuntimeArgs
from runtime.server.generate_request import PreparedRequest, RequestValueError

if TYPE_CHECKING:  # torch loads with the engine, not with the request parser
    from runtime.scheduler.grammar import GrammarBackend

logger = logging.getLogger("runtime.server")

NONE_MESSAGE = (
    "Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported when the server is "
    "launched with --grammar-backend none"
)  # SGLang's words


class GrammarBackendUnavailable(RuntimeError):
    """--grammar-backend llguidance but the package is not installed."""


def _eos_ids(model_dir: Path, hf_config: dict[str, Any]) -> list[int]:
    """The tokens that end a completed grammar: the model's EOS ids (config.json, generation_config.json)."""
    ids: list[int] = []
    sources: list[Any] = [hf_config.get("eos_token_id")]
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        try:
            sources.append(json.loads(gen.read_text()).get("eos_token_id"))
        except (json.JSONDecodeError, OSError):
            pass  # the model loader reports a broken file; the grammar then uses config.json's ids
    for value in sources:
        for token in value if isinstance(value, list) else [value]:
            if isinstance(token, int) and token not in ids:
                ids.append(token)
    return ids


def grammar_backend_options(args: RuntimeArgs, vocab_size: int, hf_config: dict[str, Any]) -> dict[str, Any] | None:
    """`GrammarBackend.load`'s keyword arguments for these flags (the engine process builds its own backend
    from them); None with --grammar-backend none."""
    if args.grammar_backend == "none":
        return None
    return {
        "tokenizer_dir": args.resolved_tokenizer_path,
        "vocab_size": vocab_size,
        "eos_token_ids": _eos_ids(Path(args.model_path), hf_config),
        "any_whitespace": not args.constrained_json_disable_any_whitespace,
        "whitespace_pattern": args.constrained_json_whitespace_pattern,
    }


def load_grammar_backend(args: RuntimeArgs, vocab_size: int, hf_config: dict[str, Any]) -> GrammarBackend | None:
    options = grammar_backend_options(args, vocab_size, hf_config)
    if options is None:
        return None
    # Found, not imported: llguidance loads with the first grammar compiled (GrammarBackend.tokenizer).
    if importlib.util.find_spec("llguidance") is None:
        raise GrammarBackendUnavailable(
            "--grammar-backend llguidance: the llguidance package is not installed; "
            "pip install 'llguidance==1.9.1' (the runtime extra has it), or start with --grammar-backend none"
        )
    from runtime.scheduler.grammar import GrammarBackend

    return GrammarBackend.load(options.pop("tokenizer_dir"), **options)


def attach_grammars(backend: GrammarBackend | None, prepared: list[PreparedRequest], pd_mode: str = "null") -> None:
    """Compile each request's constraint into its grammar state; RequestValueError (400) when one cannot be."""
    from runtime.scheduler.grammar import GrammarError

    for p in prepared:
        if p.constraint is None:
            continue
        if backend is None:
            raise RequestValueError(NONE_MESSAGE)
        if pd_mode != "null":
            raise RequestValueError(
                f"{p.constraint[0]}: structured output is not supported by the bundled runtime with "
                f"--disaggregation-mode {pd_mode}; send it to a server without disaggregation"
            )
        try:
            p.request.grammar = backend.compile(*p.constraint)
        except GrammarError as e:
            logger.info("request %s: %s", p.request.rid, e)
            raise RequestValueError(str(e)) from None


def response_format_schema(response_format: Any) -> str | None:
    """OpenAI `response_format` as SGLang's `json_schema` sampling parameter (serving_completions.py):
    json_object is `{"type": "object"}`, json_schema its `schema` (required), text nothing."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise RequestValueError(f"response_format must be an object, got {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return '{"type": "object"}'
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise RequestValueError("response_format.json_schema must be an object with a name and a schema")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise RequestValueError(f"response_format.json_schema.strict must be a boolean, got {strict!r}")
        schema = spec.get("schema")
        if schema is None:
            raise RequestValueError("schema_ is required for json_schema response format request.")
        if not isinstance(schema, dict):
            raise RequestValueError("response_format.json_schema.schema must be a JSON object (a JSON Schema)")
        return json.dumps(schema)
    raise RequestValueError(
        f"response_format.type={kind!r} is not implemented by the bundled runtime (accepted: 'text', "
        "'json_object', 'json_schema')"
    )
