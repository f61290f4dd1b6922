"""`verify structured`: N sampled requests constrained by a JSON schema; every answer must parse and validate.

The requests go to the native `/generate` with `sampling_params.json_schema` (SGLang's structured output; the
bundled runtime's and SGLang's servers both take it), at temperature 1.0 by default so the grammar, not the
model's most likely answer, is what keeps the output valid. An answer cut by the token budget is counted as
invalid (it is not JSON) and named as such, so the fix is obvious.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from hybridctl.verify.client import SGLangClient
from hybridctl.verify.report import CheckResult
from hybridshared.units import format_percent

# A small schema with every JSON kind a structured-output client relies on: an object with required keys, no
# extras, a bounded integer, an enum, a bounded string, a boolean and a short array.
DEFAULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "color", "active", "tags"],
    "additionalProperties": False,
}
_PROMPTS = (
    "Describe a person as JSON:",
    "Return one user record:",
    "Invent a customer profile:",
    "A JSON object for a new account:",
)


class SchemaFileError(ValueError):
    """--schema names a file that is not a JSON schema (usage problem, exit code 2)."""


@dataclass
class StructuredOptions:
    requests: int = 20
    max_new_tokens: int = 256
    temperature: float = 1.0
    concurrency: int = 8
    min_valid_rate: float = 1.0  # the article's bar: every answer valid
    schema: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SCHEMA))

    def validate(self) -> None:
        if self.requests < 1:
            raise SchemaFileError(f"--requests {self.requests}: send at least one request")
        if self.concurrency < 1:
            raise SchemaFileError(f"--concurrency {self.concurrency}: must be at least 1")
        if not 0.0 <= self.min_valid_rate <= 1.0:
            raise SchemaFileError(f"--min-valid-rate {self.min_valid_rate}: must be in [0, 1]")


def load_schema(path: Path) -> dict[str, Any]:
    """A JSON schema from a file, checked as a schema (jsonschema's meta-schema)."""

    try:
        schema = json.loads(path.read_text())
    except OSError as exc:
        raise SchemaFileError(f"--schema {path}: cannot be read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise SchemaFileError(f"--schema {path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    except UnicodeDecodeError:
        raise SchemaFileError(f"--schema {path}: not UTF-8 text, so not a JSON schema") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise SchemaFileError(f"--schema {path}: nested thousands of levels deep; not a usable JSON schema") from None
    if not isinstance(schema, dict):
        raise SchemaFileError(f"--schema {path}: a JSON schema is an object, this file holds a {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SchemaFileError(f"--schema {path}: not a valid JSON schema: {exc.message}") from None
    return schema


@dataclass
class Answer:
    status: int
    text: str = ""
    finish: str | None = None
    error: str | None = None  # the server's refusal, or why the output is not valid
    valid_json: bool = False
    schema_valid: bool = False


def judge_answer(status: int, body: Any, schema: dict[str, Any]) -> Answer:
    """One answer against the schema; pure."""

    if status != 200 or not isinstance(body, dict):
        message = body.get("error") if isinstance(body, dict) else body
        if isinstance(message, dict):
            message = message.get("message")
        return Answer(status, error=f"HTTP {status}: {str(message)[:200]}")
    raw_text = body.get("text")
    text = raw_text if isinstance(raw_text, str) else ""
    reason = (body.get("meta_info") or {}).get("finish_reason") or {}
    answer = Answer(status, text=text, finish=reason.get("type") if isinstance(reason, dict) else None)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        cut = " (cut by the token budget: raise --max-new-tokens)" if answer.finish == "length" else ""
        answer.error = f"not JSON{cut}: {exc.msg} at char {exc.pos} of {text[:80]!r}"
        return answer
    answer.valid_json = True
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        answer.error = f"JSON that breaks the schema at {list(exc.absolute_path)}: {exc.message}"
        return answer
    answer.schema_valid = True
    return answer


def judge_structured(answers: list[Answer], options: StructuredOptions) -> tuple[list[str], dict[str, Any]]:
    """(reasons, measurements); pure."""
    n = len(answers)
    answered = [a for a in answers if a.status == 200]
    valid = sum(a.schema_valid for a in answers)
    rate = valid / n if n else 0.0
    measured: dict[str, Any] = {
        "requests": n,
        "answered": len(answered),
        "valid_json": sum(a.valid_json for a in answers),
        "schema_valid": valid,
        "valid_rate": round(rate, 4),
        "min_valid_rate": options.min_valid_rate,
        "truncated": sum(a.finish == "length" for a in answered),
        "temperature": options.temperature,
        "max_new_tokens": options.max_new_tokens,
    }
    reasons: list[str] = []
    refused = [a for a in answers if a.status != 200]
    if refused:
        reasons.append(
            f"{len(refused)} of {n} requests were refused ({refused[0].error}): the server does not take "
            "sampling_params.json_schema — on SGLang --grammar-backend must be xgrammar or llguidance, not "
            "none; the bundled runtime needs llguidance installed"
        )
    bad = [a for a in answered if not a.schema_valid]
    if rate < options.min_valid_rate and bad:
        reasons.append(
            f"{len(bad)} of {len(answered)} answers are not valid for the schema (valid rate {format_percent(rate)} < "
            f"{format_percent(options.min_valid_rate)}); first: {bad[0].error}"
        )
    return reasons, measured


def run_structured(
    client: SGLangClient, options: StructuredOptions, on_answer: Callable[[int], None] | None = None
) -> CheckResult:
    schema_text = json.dumps(options.schema)

    def one(i: int) -> Answer:
        body = {
            "text": _PROMPTS[i % len(_PROMPTS)],
            "sampling_params": {
                "temperature": options.temperature,
                "max_new_tokens": options.max_new_tokens,
                "json_schema": schema_text,
            },
        }
        status, answer = client.post_generate(body)
        if on_answer is not None:
            on_answer(i)
        return judge_answer(status, answer, options.schema)

    with ThreadPoolExecutor(max_workers=min(options.concurrency, options.requests)) as pool:
        answers = list(pool.map(one, range(options.requests)))
    reasons, measured = judge_structured(answers, options)
    summary = (
        f"{measured['schema_valid']}/{measured['requests']} answers valid JSON for the schema "
        f"at temperature {options.temperature:g}"
    )
    return CheckResult("structured", "failed" if reasons else "passed", summary, reasons, [], measured)
