"""The reference row: transformers' own `generate` (fp32, greedy, no server) on the same prompts.

It has no prefix cache, so warm and repeat cost what cold costs; concurrency is one batched `generate` of the
8 prompts (they have equal lengths, so no padding); the generated-shared-prefix set runs as shuffled batches
of 8. TTFT is when `generate` hands its streamer the first new token. Its greedy output of the single-stream
prompt is the token sequence every engine is compared with.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from workloads import CONC_OUT, GSP_CONCURRENCY, GSP_SHAPE, REPEAT_OUT, SINGLE_OUT, Prompts


class _FirstToken:
    """A generate streamer that notes when the first new token is produced (the first put is the prompt)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.puts = 0
        self.first: float | None = None

    def put(self, value: Any) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter() - self.start

    def end(self) -> None:
        pass


def measure_hf(model_dir: Path, prompts: Prompts, threads: int) -> dict[str, Any]:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()

    def run(batch: list[list[int]], max_new: int) -> tuple[float, float, list[list[int]]]:
        ids = torch.tensor(batch, dtype=torch.long)
        # eos_token_id=None: run to max_new like ignore_eos (min_new_tokens would mask EOS and change argmax).
        config = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=None, pad_token_id=0)
        streamer = _FirstToken()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, streamer=streamer)
        e2e = time.perf_counter() - streamer.start
        new = out[:, ids.shape[1] :].tolist()
        assert all(len(row) == max_new for row in new), "generate stopped early"
        assert streamer.first is not None
        return streamer.first, e2e, new

    run([prompts.warmup], 4)
    cold, warm = [], []
    # One repetition: without a prefix cache every repetition is the same work, and each costs minutes.
    for cold_ids, warm_ids in zip(prompts.cold[:1], prompts.warm[:1], strict=True):
        cold.append(run([cold_ids], REPEAT_OUT)[0])
        warm.append(run([warm_ids], REPEAT_OUT)[0])
    _, conc_wall, conc_out = run(prompts.concurrent[0], CONC_OUT)
    ttft, e2e, single_out = run([prompts.single[0]], SINGLE_OUT)
    gsp_ttft, gsp_tokens, gsp_start = [], 0, time.perf_counter()
    for i in range(0, len(prompts.gsp), GSP_CONCURRENCY):
        batch = prompts.gsp[i : i + GSP_CONCURRENCY]
        first, _, out = run(batch, GSP_SHAPE.output_len)
        # A batch starts when the one before it ends, as a request waits for a free slot in a server.
        gsp_ttft += [first] * len(batch)
        gsp_tokens += sum(len(row) for row in out)
    gsp_wall = time.perf_counter() - gsp_start
    cold_ms = 1000 * statistics.median(cold)
    return {
        "cold_ttft_ms": cold_ms,
        "warm_ttft_ms": 1000 * statistics.median(warm),
        "warm_over_cold": statistics.median(warm) / statistics.median(cold),
        "warm_cached_tokens": [0] * len(warm),
        "repeat_ttft_ms": cold_ms,  # no cache: a repeat is a cold prompt again (not re-measured)
        "repeat_cached_tokens": [0] * len(cold),
        "repeat_output_matches_cold": None,
        "concurrent_out_tok_s": sum(len(r) for r in conc_out) / conc_wall,
        "single_decode_tok_s": (SINGLE_OUT - 1) / (e2e - ttft),
        "single_ttft_ms": 1000 * ttft,
        "single_output_ids": single_out[0],
        "gsp_out_tok_s": gsp_tokens / gsp_wall,
        "gsp_mean_ttft_ms": 1000 * statistics.mean(gsp_ttft),
        "gsp_cache_hit_rate": 0.0,
        "raw_ttft_ms": {"cold": [1000 * s for s in cold], "warm": [1000 * s for s in warm]},
    }
