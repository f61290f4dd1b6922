"""`run_bench`: build the dataset, scrape `/metrics`, run the load, scrape again, aggregate.

The server is asked for its tokenizer path (`/model_info`) so lengths are exact when that directory is readable from
here; `flush` empties the prefix cache first so a run does not profit from an earlier one.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import get_args

from hybridctl.bench.datasets import (
    BenchRequest,
    DatasetError,
    DatasetName,
    RandomShape,
    SharedPrefixShape,
    check_shape,
    generated_shared_prefix,
    random_dataset,
)
from hybridctl.bench.loadgen import LoadShape, RequestRecord, run_load
from hybridctl.bench.results import BenchResult, summarize_run
from hybridctl.config.schema import HybridConfig
from hybridctl.verify.client import SGLangClient, Target
from hybridctl.verify.document import load_prompt_builder
from hybridctl.verify.prefix_cache import tokenizer_candidates


class BenchOptionsError(ValueError):
    pass


@dataclass
class BenchOptions:
    dataset: DatasetName = "generated-shared-prefix"
    shared_prefix: SharedPrefixShape = field(default_factory=SharedPrefixShape)
    random: RandomShape = field(default_factory=RandomShape)
    load: LoadShape = field(default_factory=LoadShape)
    flush: bool = True

    def validate(self) -> None:
        names = get_args(DatasetName)
        if self.dataset not in names:
            raise BenchOptionsError(f"--dataset {self.dataset!r} is not known; use {' or '.join(names)}")
        if self.load.max_concurrency is not None and self.load.max_concurrency < 1:
            # The CLI turns 0 into None (no limit), so the message offers both.
            raise BenchOptionsError(
                f"--max-concurrency must be >= 1, or 0 for no limit (got {self.load.max_concurrency})"
            )
        if not self.load.request_rate > 0:
            raise BenchOptionsError(f"--request-rate must be > 0 or inf (got {self.load.request_rate})")
        try:
            check_shape(self.shared_prefix if self.dataset == "generated-shared-prefix" else self.random)
        except DatasetError as exc:
            raise BenchOptionsError(str(exc)) from None

    def describe(self) -> dict[str, object]:
        shape = asdict(self.shared_prefix if self.dataset == "generated-shared-prefix" else self.random)
        rate = self.load.request_rate
        return {
            "dataset": self.dataset,
            **shape,
            "max_concurrency": self.load.max_concurrency,
            "request_rate": "inf" if math.isinf(rate) else rate,
            "seed": self.load.seed,
            "flush": self.flush,
        }


def build_requests(options: BenchOptions, client: SGLangClient, config: HybridConfig | None) -> tuple[
    list[BenchRequest], str]:  # fmt: skip
    builder, note = load_prompt_builder(tokenizer_candidates(config, client.model_info()))
    if options.dataset == "generated-shared-prefix":
        return generated_shared_prefix(builder, options.shared_prefix, options.load.seed), note
    return random_dataset(builder, options.random, options.load.seed), note


def run_bench(
    target: Target,
    options: BenchOptions,
    config: HybridConfig | None = None,
    on_start: Callable[[int], None] | None = None,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> BenchResult:
    """Raises ServerUnreachable when the server does not answer at all."""
    options.validate()
    with SGLangClient(target) as client:
        client.health()
        requests, tokenizer_note = build_requests(options, client, config)
        flush_note = None
        if options.flush:
            ok, message = client.flush_cache()
            flush_note = (
                None if ok else f"/flush_cache refused ({message}): the run may reuse earlier cache entries"
            )
        before = client.metrics()
        if on_start is not None:
            on_start(len(requests))
        run = asyncio.run(run_load(target, requests, options.load, on_done))
        after = client.metrics()
    result = summarize_run(run, {**options.describe(), "url": target.url}, before, after)
    result.notes.insert(0, f"prompt lengths: {tokenizer_note}")
    if flush_note:
        result.notes.append(flush_note)
    return result
