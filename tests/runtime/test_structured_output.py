"""Structured output (llguidance) through real servers: raw /generate (json_schema, regex, ebnf), the official
`openai` client (sync and async, stream and not) with response_format, a constrained request's grammar under
speculative decoding, greedy identity, and bad grammars failing alone."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest

from runtime.server.tokenizer import ServerTokenizer
from tests.runtime.conftest import REPO_ROOT, RunningServer, start_runtime_server

openai = pytest.importorskip("openai")

# Short and bounded, so a random-weight model at temperature 1.0 finishes well inside max_tokens: validity then
# comes from the grammar alone.
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["ok", "n", "color"],
    "additionalProperties": False,
}
_META = set(r"\.^$|?*+()[]{}-")


def _regex_literal(text: str) -> str:
    return "".join("\\" + c if c in _META else c for c in text)


@pytest.fixture(scope="module")
def server(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # Compact JSON (SGLang's --constrained-json-disable-any-whitespace): free whitespace is valid JSON too, but a
    # random-weight model fills its token budget with it.
    flags = ("--memory-budget-gib", "1", "--constrained-json-disable-any-whitespace")
    with start_runtime_server(demo_model_dir, *flags, log_dir=tmp_path_factory.mktemp("structured")) as s:
        yield s


@pytest.fixture(scope="module")
def spec_server(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    flags = ("--memory-budget-gib", "1", "--constrained-json-disable-any-whitespace", "--speculative-algorithm",
             "NGRAM", "--speculative-num-steps", "3")  # fmt: skip
    with start_runtime_server(demo_model_dir, *flags, log_dir=tmp_path_factory.mktemp("structured-spec")) as s:
        yield s


def _generate(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/generate", json=body, timeout=300)


def test_hundred_json_schema_requests_at_temperature_one_all_validate(server: RunningServer) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)
    response_format = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA, "strict": True}}

    async def one(i: int) -> str | None:
        r = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": f"Record number {i}, as JSON:"}],
            response_format=response_format,  # type: ignore[arg-type]
            temperature=1.0,
            max_tokens=48,
            seed=i,
        )
        return r.choices[0].message.content

    async def run_all() -> list[str | None]:
        try:
            return await asyncio.gather(*(one(i) for i in range(100)))
        finally:
            await client.close()

    texts = asyncio.run(run_all())
    values = []
    for text in texts:
        assert text is not None
        value = json.loads(text)
        jsonschema.validate(value, SCHEMA)
        values.append(value)
    assert len({json.dumps(v, sort_keys=True) for v in values}) > 5, "temperature 1.0 should give varied records"


def test_generate_regex_ebnf_and_json_schema(server: RunningServer) -> None:
    cases = [
        ({"regex": "(yes|no|maybe)"}, lambda t: re.fullmatch("(yes|no|maybe)", t)),
        ({"regex": r"[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
        ({"ebnf": 'root ::= "id:" [0-9] [0-9] ";"'}, lambda t: re.fullmatch(r"id:[0-9]{2};", t)),
        ({"json_schema": json.dumps(SCHEMA)}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ]
    for constraint, check in cases:
        # A batch of prompts: each gets its own grammar state.
        body = {
            "text": ["Answer:", "The value is", "Say something"],
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 48, **constraint},
        }
        r = _generate(server.url, body)
        assert r.status_code == 200, r.text
        for out in r.json():
            assert check(out["text"]), (constraint, out["text"])
            assert out["meta_info"]["finish_reason"]["type"] == "stop", out["meta_info"]


def test_constrained_greedy_equals_unconstrained_when_the_grammar_allows_it(server: RunningServer) -> None:
    """Greedy under a mask that allows the unconstrained greedy answer picks the same tokens (the argmax is never
    masked). The demo's model has 4096 logits for a 3440-token tokenizer: an answer holding one of the
    tokenizer-less ids has no text a grammar could allow, so prompts whose answer has one are passed over."""
    tokenizer_path = httpx.get(f"{server.url}/model_info", timeout=30).json()["tokenizer_path"]
    vocab = ServerTokenizer.load(tokenizer_path).vocab_size
    compared = 0
    for prompt in [f"Story number {i} begins:" for i in range(16)]:
        base = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}}
        free = _generate(server.url, base).json()
        if any(t >= vocab for t in free["output_ids"]) or "\ufffd" in free["text"] or not free["text"]:
            continue
        # Every string over the answer's characters: the answer is allowed, nothing is forced (llguidance emits a
        # forced literal in its canonical tokenization, which need not be the model's).
        charset = "".join(sorted({_regex_literal(c) for c in free["text"]}))
        constrained = {**base, "sampling_params": {**base["sampling_params"], "regex": f"[{charset}]*"}}
        got = _generate(server.url, constrained).json()
        assert got["output_ids"][:6] == free["output_ids"], prompt
        assert got["text"] == free["text"]
        compared += 1
    assert compared >= 2


def test_spec_decoding_follows_the_grammar(server: RunningServer, spec_server: RunningServer) -> None:
    """Drafts are checked against the grammar row by row and only the kept prefix advances it: a constrained
    greedy request gives the same tokens with and without speculative decoding."""
    prompt = "The cache holds the state. The cache holds the state. The cache holds"
    for constraint in ({"regex": "( the state\\.| a cache\\.)+"}, {"json_schema": json.dumps(SCHEMA)}):
        body = {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 32, **constraint}}
        plain = _generate(server.url, body)
        spec = _generate(spec_server.url, body)
        assert plain.status_code == spec.status_code == 200, (plain.text, spec.text)
        assert spec.json()["output_ids"] == plain.json()["output_ids"]
        assert spec.json()["meta_info"]["spec_verify_ct"] >= 1
        if "regex" in constraint:  # drafts from the repeated prompt fit the grammar: the accepted path runs
            assert spec.json()["meta_info"]["spec_num_correct_drafts"] >= 1
    sampled = {
        "text": prompt,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 48, "json_schema": json.dumps(SCHEMA)},
    }
    for _ in range(5):
        out = _generate(spec_server.url, sampled).json()
        jsonschema.validate(json.loads(out["text"]), SCHEMA)


def test_openai_response_format_sync_stream_and_completions(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
    chat = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], response_format=fmt, temperature=1.0, max_tokens=48
    )
    jsonschema.validate(json.loads(chat.choices[0].message.content or ""), SCHEMA)
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        response_format=fmt,
        temperature=1.0,
        max_tokens=48,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)
    # json_object: SGLang's {"type": "object"}; on completions too (SGLang's completions take response_format).
    obj = client.completions.create(
        model="m",
        prompt="{",
        max_tokens=40,
        temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}},
    )
    jsonschema.validate(json.loads(obj.choices[0].text), SCHEMA)
    with pytest.raises(openai.BadRequestError, match="schema_ is required"):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x"}},  # type: ignore[typeddict-item]
        )


def test_bad_grammars_fail_alone(server: RunningServer) -> None:
    good = {"text": "Hello", "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}}
    before = _generate(server.url, good).json()["output_ids"]
    bad = [
        ({"regex": "[a-"}, "Failed to compile regex grammar"),
        ({"json_schema": "{not json"}, "Failed to compile json grammar"),
        ({"ebnf": "root ::= missing"}, "Failed to compile ebnf grammar"),
        ({"regex": "a", "json_schema": "{}"}, "Only one of json_schema, regex, ebnf"),
    ]
    for constraint, message in bad:
        r = _generate(server.url, {"text": "Hello", "sampling_params": constraint})
        assert r.status_code == 400, r.text
        assert message in r.json()["error"]["message"]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="Failed to compile json grammar"):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
        )
    assert _generate(server.url, good).json()["output_ids"] == before
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200


def test_grammar_backend_flag_refuses_engines_it_does_not_ship(demo_model_dir: Path) -> None:
    for name in ("xgrammar", "outlines"):
        cmd = [sys.executable, "-m", "runtime", "--model-path", str(demo_model_dir), "--grammar-backend", name]
        done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert f"--grammar-backend {name}" in done.stderr and "llguidance" in done.stderr
        assert "Traceback" not in done.stderr


def _hybridctl(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hybridctl", *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)


def test_verify_structured_passes_and_fails_with_reasons(server: RunningServer, tmp_path: Path) -> None:
    ok = _hybridctl("verify", "structured", "--url", server.url, "--requests", "20", "--json")
    assert "Traceback" not in ok.stderr, ok.stderr
    report = json.loads(ok.stdout)
    assert ok.returncode == 0, ok.stdout
    m = report["checks"][0]["measurements"]
    assert report["checks"][0]["name"] == "structured" and report["passed"] is True
    assert m["requests"] == m["answered"] == m["schema_valid"] == 20 and m["valid_rate"] == 1.0
    # A budget too small for any record: every answer is cut, the check fails and says what to raise.
    cut = _hybridctl("verify", "structured", "--url", server.url, "--requests", "4", "--max-new-tokens", "3", "--json")
    assert cut.returncode == 1, cut.stdout
    failed = json.loads(cut.stdout)["checks"][0]
    assert failed["status"] == "failed" and failed["measurements"]["truncated"] == 4
    assert "raise --max-new-tokens" in failed["reasons"][0]
    # A schema file of the user's: used when valid, refused by name (exit 2) when it is not a schema.
    schema = tmp_path / "schema.json"
    own_schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    schema.write_text(json.dumps({**own_schema, "additionalProperties": False}))
    own = _hybridctl("verify", "structured", "--url", server.url, "--requests", "3", "--schema", str(schema))
    assert own.returncode == 0, own.stdout + own.stderr
    schema.write_text(json.dumps({"type": 5}))
    bad = _hybridctl("verify", "structured", "--url", server.url, "--schema", str(schema))
    assert bad.returncode == 2 and "not a valid JSON schema" in bad.stderr and "Traceback" not in bad.stderr
