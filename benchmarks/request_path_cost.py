"""What a cached prompt's request costs before and after its forward, piece by piece, old way vs new, side by side.

The peers harness's exact repeat (2048 prompt ids, 2047 served by the prefix cache) computes one token: its TTFT
is ~12 ms where the forward is ~3. This times the host work around it, new way vs old, each pair
interleaved in one process (ratios hold on a noisy host; medians of --reps):

- body: `parse_json` of a 2048-id /generate body with the nesting walk over every id vs the bracket-count
  shortcut (runtime/server/limits.py);
- hop: `parse_generate_body` on a worker thread (`asyncio.to_thread`, as every request paid) vs inline (token ids
  need no tokenizer), and the second hop for grammars that no request asked for;
- rows: a batch's logits rows through advanced indexing (`logits[rows]`) vs `select_rows` (index_select), on
  two torch threads (the engine's count; advanced indexing opens an OpenMP region);
- slots: a 2000-token request's KV slots as `torch.tensor(pages)` vs the page list's mirror
  (`CacheManager.token_slots`).

    python benchmarks/request_path_cost.py [--reps 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable

import runtime  # noqa: F401 - first: its OpenMP settings only take effect before torch loads

# isort: split
import torch

from runtime.kvcache.page_list import PageList
from runtime.scheduler.sampling import select_rows
from runtime.server.generate_request import parse_generate_body
from runtime.server.limits import parse_json, too_deep  # too_deep: the old path, for the comparison

PROMPT = 2048


def median_us(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def pair(name: str, old: Callable[[], object], new: Callable[[], object], reps: int) -> None:
    olds, news = [], []
    for _ in range(5):  # alternate blocks: drift on a shared host hits both sides
        olds.append(median_us(old, reps // 5 or 1))
        news.append(median_us(new, reps // 5 or 1))
    o, n = statistics.median(olds), statistics.median(news)
    print(f"{name:<46} {o:9.1f} {n:9.1f} {n / o:7.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=200)
    a = p.parse_args()
    torch.set_num_threads(2)
    body = {"input_ids": list(range(PROMPT)), "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    raw = json.dumps(body).encode()
    parsed = json.loads(raw)

    def old_parse() -> object:
        value = json.loads(raw)
        too_deep(value)
        return value

    def parse_args() -> object:
        return parse_generate_body(parsed, encode=None, vocab_size=1 << 20, context_len=1 << 20)

    loop = asyncio.new_event_loop()

    def hop() -> object:
        return loop.run_until_complete(asyncio.to_thread(parse_args))

    logits = torch.randn(1, 4096)
    pages = PageList(range(10, 10 + 2000))
    pages.as_tensor(len(pages))  # the mirror is filled as the request's prefill grew it

    print(f"{'median us (old, new, new / old)':<46} {'old':>9} {'new':>9} {'ratio':>7}")
    pair("body: parse_json, 2048 ids", old_parse, lambda: parse_json(raw), a.reps)
    pair("hop: parse_generate_body, thread vs inline", hop, parse_args, a.reps)
    pair("rows: logits[[0]] vs select_rows, 2 threads", lambda: logits[[0]], lambda: select_rows(logits, [0]), a.reps)
    two = torch.randn(2, 4096)
    pair("rows: 1 of 2 rows", lambda: two[[1]], lambda: select_rows(two, [1]), a.reps)
    pair(
        "slots: 2000 pages, torch.tensor vs mirror",
        lambda: torch.tensor(pages[:2000], dtype=torch.int64),
        lambda: pages.as_tensor(2000).clone(),
        a.reps,
    )
    loop.close()


if __name__ == "__main__":
    main()
