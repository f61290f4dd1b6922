"""The server's tokenizer: streamed text always extends what was sent and ends equal to a one-shot decode."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.server.tokenizer import IncrementalDetokenizer, ServerTokenizer


def test_chat_template_and_round_trip(demo_model_dir: Path) -> None:
    tok = ServerTokenizer.load(demo_model_dir)
    text = "Hello world, ünïcode ☃!"
    assert tok.decode(tok.encode(text)) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert "hi" in prompt and prompt != "hi"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_incremental_detokenizer_matches_full_decode(demo_model_dir: Path, data: st.DataObject) -> None:
    tok = ServerTokenizer.load(demo_model_dir)
    # Multi-byte characters split across byte-level tokens are the interesting case: mix them in.
    text = data.draw(st.text(alphabet="aé☃漢 🙂\n.,", min_size=1, max_size=40))
    ids = tok.encode(text) + data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=20))
    steps = data.draw(st.lists(st.integers(1, 4), min_size=len(ids), max_size=len(ids)))
    detok = IncrementalDetokenizer(tok)
    i = 0
    for k in steps:
        if i >= len(ids):
            break
        before = detok.text
        detok.extend(ids[i : i + k])
        assert detok.text.startswith(before)
        i += k
    detok.extend(ids[i:], final=True)
    assert detok.text == tok.decode(ids)
