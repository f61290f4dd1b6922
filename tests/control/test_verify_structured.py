"""`verify structured`'s judgement, pure: which answers count as valid, and what the reasons say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridctl.verify.structured import (
    DEFAULT_SCHEMA,
    SchemaFileError,
    StructuredOptions,
    judge_answer,
    judge_structured,
    load_schema,
)

GOOD = {"name": "Ada", "age": 36, "color": "red", "active": True, "tags": ["a"]}


def _answer(text: str, finish: str = "stop") -> dict:
    return {"text": text, "meta_info": {"finish_reason": {"type": finish}}}


def test_valid_invalid_and_cut_answers() -> None:
    good = judge_answer(200, _answer(json.dumps(GOOD)), DEFAULT_SCHEMA)
    assert good.valid_json and good.schema_valid and good.error is None
    extra = judge_answer(200, _answer(json.dumps({**GOOD, "x": 1})), DEFAULT_SCHEMA)
    assert extra.valid_json and not extra.schema_valid and "breaks the schema" in (extra.error or "")
    old = judge_answer(200, _answer(json.dumps({**GOOD, "age": 300})), DEFAULT_SCHEMA)
    assert not old.schema_valid and "['age']" in (old.error or "")
    cut = judge_answer(200, _answer('{"name": "Ad', "length"), DEFAULT_SCHEMA)
    assert not cut.valid_json and "raise --max-new-tokens" in (cut.error or "")
    refused = judge_answer(400, {"error": {"message": "Grammar-based generation ... none"}}, DEFAULT_SCHEMA)
    assert refused.status == 400 and "HTTP 400: Grammar-based" in (refused.error or "")


def test_judge_counts_and_reasons() -> None:
    opts = StructuredOptions(requests=4)
    answers = [judge_answer(200, _answer(json.dumps(GOOD)), DEFAULT_SCHEMA) for _ in range(4)]
    reasons, m = judge_structured(answers, opts)
    assert reasons == [] and m["valid_rate"] == 1.0 and m["schema_valid"] == 4
    answers[1] = judge_answer(200, _answer("{", "length"), DEFAULT_SCHEMA)
    reasons, m = judge_structured(answers, opts)
    assert m["valid_rate"] == 0.75 and m["truncated"] == 1 and "1 of 4 answers" in reasons[0]
    reasons, _ = judge_structured(answers, StructuredOptions(requests=4, min_valid_rate=0.7))
    assert reasons == []
    answers[2] = judge_answer(400, {"error": {"message": "no grammar"}}, DEFAULT_SCHEMA)
    reasons, m = judge_structured(answers, StructuredOptions(requests=4, min_valid_rate=0.0))
    assert m["answered"] == 3 and "refused" in reasons[0] and "--grammar-backend" in reasons[0]


def test_schema_files_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(DEFAULT_SCHEMA))
    assert load_schema(path) == DEFAULT_SCHEMA
    for text, message in (("{", "not JSON"), ("[1]", "is an object"), ('{"type": 5}', "not a valid JSON schema")):
        path.write_text(text)
        with pytest.raises(SchemaFileError, match=message):
            load_schema(path)
    with pytest.raises(SchemaFileError, match="cannot be read"):
        load_schema(tmp_path / "missing.json")
    with pytest.raises(SchemaFileError, match="--requests"):
        StructuredOptions(requests=0).validate()
