"""docs/runtime-api.md's table of SGLang 0.5.23's request fields is true: every refused row answers 400 naming the
field (sent with the row's example value), and the table lists exactly the fields SGLang's source declares."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.server.generate_request import SGLANG_SAMPLING_FIELDS
from tests.control.sglang_source import SKIP_REASON, SRT
from tests.runtime.conftest import RunningServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "runtime-api.md"
ROW = re.compile(r"^\| `([^`]+)` \| (supported|refused|ignored|internal) \| (?:`(.*)`)? \|", re.M)


def tables() -> dict[str, list[tuple[str, str, Any]]]:
    """Section key ("generate", "sampling", "completions", "chat") -> (field, status, example) rows."""
    text = DOC.read_text().split("## SGLang 0.5.23's request fields", 1)[1].split("\n## ", 1)[0]
    out: dict[str, list[tuple[str, str, Any]]] = {}
    for section in text.split("\n### ")[1:]:
        title = section.splitlines()[0]
        key = ("sampling" if "sampling_params" in title else "generate" if "/generate" in title
               else "completions" if "/v1/completions" in title else "chat")  # fmt: skip
        out[key] = [(f, st, json.loads(ex) if ex else None) for f, st, ex in ROW.findall(section)]
    return out


TABLES = tables()
REFUSED = [
    (key, field, example) for key, rows in TABLES.items() for field, status, example in rows if status == "refused"
]


def test_the_table_has_every_section_and_an_example_per_refused_row() -> None:
    assert set(TABLES) == {"generate", "sampling", "completions", "chat"}
    assert len(REFUSED) > 50
    assert all(example is not None for _, _, example in REFUSED)
    assert [f for f, _, _ in TABLES["sampling"]] == list(SGLANG_SAMPLING_FIELDS)


def _request(key: str, field: str, example: Any) -> tuple[str, dict[str, Any]]:
    if key == "sampling":
        return "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 1, field: example}}
    if key == "generate":
        return "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 1}, field: example}
    if key == "completions":
        return "/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 1, field: example}
    return "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                    field: example}  # fmt: skip


def test_every_refused_row_answers_400_naming_the_field(runtime_server: RunningServer) -> None:
    wrong = []
    with httpx.Client(base_url=runtime_server.url, timeout=60) as client:
        for key, field, example in REFUSED:
            path, body = _request(key, field, example)
            response = client.post(path, json=body)
            if response.status_code != 400 or field not in response.text:
                wrong.append(f"{key} {field}={example!r}: HTTP {response.status_code} {response.text[:160]}")
    assert not wrong, "\n".join(wrong)


def _declared(path: Path, name: str) -> list[str]:
    tree = ast.parse(path.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    names = [b.target.id for b in node.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)]
    return [n for n in names if not n.startswith("_")]


@pytest.mark.sglang
def test_the_table_lists_exactly_sglangs_fields() -> None:
    if not SRT.is_dir():
        pytest.skip(SKIP_REASON)
    protocol = SRT / "entrypoints/openai/protocol.py"
    routing = _declared(protocol, "PDRoutingFields")
    expected = {
        "generate": _declared(SRT / "managers/io_struct.py", "GenerateReqInput"),
        "completions": _declared(protocol, "CompletionRequest") + routing,
        "chat": _declared(protocol, "ChatCompletionRequest") + routing,
    }
    for key, fields in expected.items():
        listed = [f for f, _, _ in TABLES[key]]
        assert sorted(listed) == sorted(fields), (
            f"{key}: missing {set(fields) - set(listed)}, extra {set(listed) - set(fields)}"
        )
