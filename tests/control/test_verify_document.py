"""Prompts of a known length: exact token ids with a tokenizer.json, estimated text without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridctl.bench.datasets import (
    DatasetError,
    RandomShape,
    SharedPrefixShape,
    generated_shared_prefix,
    random_dataset,
)
from hybridctl.verify.document import PromptBuilder, load_prompt_builder


def _write_tokenizer(directory: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [
        "the cache holds the recurrent state of every layer",
        "a prefix of tokens shared by requests",
    ] * 50
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory


def test_exact_lengths_with_a_tokenizer(tmp_path: Path) -> None:
    model_dir = _write_tokenizer(tmp_path / "model")
    builder, note = load_prompt_builder([None, str(tmp_path / "missing"), str(model_dir)])
    assert builder.exact and "exact token ids" in note and str(model_dir) in note
    doc = builder.document(300, seed=1)
    assert isinstance(doc, list) and len(doc) == 300
    assert builder.document(300, seed=1) == doc and builder.document(300, seed=2) != doc
    q1, q2 = builder.question(12, seed=1), builder.question(12, seed=2)
    assert len(q1) == len(q2) == 12 and q1 != q2
    prompt = builder.join(doc, q1)
    assert prompt[:300] == doc and builder.count(prompt) == 312


def test_text_prompts_without_a_tokenizer(tmp_path: Path) -> None:
    builder, note = load_prompt_builder([str(tmp_path)])
    assert not builder.exact and "no tokenizer.json found" in note
    doc = builder.document(130, seed=0)
    assert isinstance(doc, str) and 80 <= builder.count(doc) <= 180
    prompt = builder.join(doc, builder.question(10, seed=0))
    assert isinstance(prompt, str) and prompt.startswith(doc)


def test_unreadable_tokenizer_falls_back_to_text(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    (tmp_path / "tokenizer.json").write_text("{not json")
    builder, note = load_prompt_builder([str(tmp_path)])
    assert not builder.exact and "could not be read" in note


def test_generated_shared_prefix_shape(tmp_path: Path) -> None:
    builder, _ = load_prompt_builder([str(_write_tokenizer(tmp_path / "m"))])
    shape = SharedPrefixShape(
        num_groups=3, prompts_per_group=4, system_prompt_len=64, question_len=8, output_len=5
    )
    requests = generated_shared_prefix(builder, shape, seed=0)
    assert len(requests) == 12 and {r.group for r in requests} == {0, 1, 2}
    assert all(r.prompt_len == 72 and r.output_len == 5 for r in requests)
    for g in range(3):
        prefixes = {tuple(r.prompt[:64]) for r in requests if r.group == g}  # type: ignore[index]
        assert len(prefixes) == 1  # one system prompt per group
    assert [r.group for r in requests] != sorted(r.group for r in requests)  # shuffled
    assert generated_shared_prefix(builder, shape, seed=0) == requests  # seeded


def test_random_dataset_lengths_and_errors() -> None:
    builder = PromptBuilder()
    requests = random_dataset(
        builder, RandomShape(num_prompts=20, input_len=100, output_len=10, range_ratio=0.5), 3
    )
    assert len(requests) == 20 and all(5 <= r.output_len <= 10 for r in requests)
    assert len({r.output_len for r in requests}) > 1
    with pytest.raises(DatasetError, match="--num-prompts must be >= 1"):
        random_dataset(builder, RandomShape(num_prompts=0), 0)
    with pytest.raises(DatasetError, match="--range-ratio"):
        random_dataset(builder, RandomShape(range_ratio=0.0), 0)
