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
    # 0: the text asked for again with nothing new (a stream does, per chunk), which must not change it.
    steps = data.draw(st.lists(st.integers(0, 4), min_size=len(ids), max_size=2 * len(ids)))
    detok = IncrementalDetokenizer(tok)
    i = 0
    for k in steps:
        if i >= len(ids):
            break
        before = detok.text
        detok.extend(ids[i : i + k])
        assert detok.text.startswith(before)
        assert k or detok.text == before
        i += k
    detok.extend(ids[i:], final=True)
    assert detok.text == tok.decode(ids)
    assert detok.extend([], final=True) == tok.decode(ids)


def test_asking_again_with_nothing_new_does_not_decode(demo_model_dir: Path) -> None:
    decodes = 0

    class Counting(ServerTokenizer):
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            nonlocal decodes
            decodes += 1
            return super().decode(ids, skip_special_tokens)

    base = ServerTokenizer.load(demo_model_dir)
    tok = Counting(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    ids = tok.encode("Hello world, ünïcode ☃!")
    detok = IncrementalDetokenizer(tok)
    text = detok.extend(ids[:3])
    spent = decodes
    assert detok.extend([]) == text and detok.extend([]) == text  # the stop hold-back check, then the chunk
    assert decodes == spent
    assert detok.extend(ids[3:], final=True) == base.decode(ids)
