"""Benchmark request sets: SGLang's generated-shared-prefix shape and a random one.

generated-shared-prefix (sglang/benchmark/datasets/generated_shared_prefix.py): `num_groups` system prompts of
`system_prompt_len` tokens, each followed by `prompts_per_group` questions of `question_len` tokens, every request
asking for `output_len` tokens, shuffled. random: independent prompts with lengths drawn uniformly from [len *
range_ratio, len]. Lengths are exact token counts when the model's tokenizer is readable (see
hybridctl/verify/document.py), estimates otherwise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from hybridctl.verify.document import PromptBuilder

DatasetName = Literal["generated-shared-prefix", "random"]


@dataclass(frozen=True)
class BenchRequest:
    prompt: str | list[int]
    prompt_len: int  # tokens (exact with a tokenizer)
    output_len: int
    group: int  # shared-prefix group; -1 for the random dataset


@dataclass(frozen=True)
class SharedPrefixShape:
    num_groups: int = 4
    prompts_per_group: int = 4
    system_prompt_len: int = 512
    question_len: int = 64
    output_len: int = 32


@dataclass(frozen=True)
class RandomShape:
    num_prompts: int = 16
    input_len: int = 256
    output_len: int = 32
    range_ratio: float = 1.0


class DatasetError(ValueError):
    pass


def _check_positive(**values: int) -> None:
    bad = [f"--{k.replace('_', '-')} must be >= 1 (got {v})" for k, v in values.items() if v < 1]
    if bad:
        raise DatasetError("; ".join(bad))


def check_shape(shape: SharedPrefixShape | RandomShape) -> None:
    """The shape's own limits, checked before any request is built (bench checks them before connecting)."""
    if isinstance(shape, SharedPrefixShape):
        _check_positive(num_groups=shape.num_groups, prompts_per_group=shape.prompts_per_group,
                        system_prompt_len=shape.system_prompt_len, question_len=shape.question_len,
                        output_len=shape.output_len)  # fmt: skip
        return
    _check_positive(num_prompts=shape.num_prompts, input_len=shape.input_len, output_len=shape.output_len)
    if not 0.0 < shape.range_ratio <= 1.0:
        raise DatasetError(f"--range-ratio must be within (0, 1] (got {shape.range_ratio})")


def _scaled(full: int, ratio: float, rng: random.Random) -> int:
    return full if ratio >= 1.0 else rng.randint(max(1, int(full * ratio)), full)


def generated_shared_prefix(
    builder: PromptBuilder, shape: SharedPrefixShape, seed: int
) -> list[BenchRequest]:
    check_shape(shape)
    requests = []
    for g in range(shape.num_groups):
        system = builder.document(shape.system_prompt_len, seed=seed * 100_003 + g)
        for p in range(shape.prompts_per_group):
            question = builder.question(shape.question_len, seed=(seed * 100_003 + g) * 1_000 + p)
            prompt = builder.join(system, question)
            requests.append(BenchRequest(prompt, builder.count(prompt), shape.output_len, g))
    random.Random(seed).shuffle(requests)
    return requests


def random_dataset(builder: PromptBuilder, shape: RandomShape, seed: int) -> list[BenchRequest]:
    check_shape(shape)
    rng = random.Random(seed)
    requests = []
    for i in range(shape.num_prompts):
        prompt = builder.document(
            _scaled(shape.input_len, shape.range_ratio, rng), seed=seed * 100_003 + 50_000 + i
        )
        requests.append(
            BenchRequest(prompt, builder.count(prompt), _scaled(shape.output_len, shape.range_ratio, rng), -1)
        )
    return requests
