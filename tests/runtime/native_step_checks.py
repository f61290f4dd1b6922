"""Checks of the native decode step shared by the per-family test files (test_native_decode_mamba2.py, _granite.py,
_falcon.py, _kimi.py): prefilled runners in state slots of random order, the engine's decode and extend batches,
and the bodies of the bf16-bits, thread-bits, transformers-generate, many-step greedy and extend-chain tests, each
taking the model and the few parameters in which the families differ."""

from __future__ import annotations

import copy
import random

import torch

from runtime.core.batch import ForwardBatch, PoolBuffers
from runtime.engine.native_decode import NativeDecode
from runtime.models.base import HybridModel
from runtime.native.amx import fma_form
from runtime.native.hybrid_decode import load_library, set_min_part_bytes, set_threads
from tests.runtime.simple_runner import SimpleRunner

VOCAB = 160


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def decode_batch(runner: SimpleRunner, tokens: dict[int, int]) -> ForwardBatch:
    """The decode batch the engine would build for one more token per sequence (slots taken from the runner)."""
    ids, positions, out_locs, kv_locs, slots, pre = [], [], [], [], [], []
    for sid, token in tokens.items():
        seq = runner.seqs[sid]
        loc = runner.next_token_slot
        runner.next_token_slot += 1
        ids.append(token)
        positions.append(len(seq.tokens))
        pre.append(len(seq.tokens))  # the new token is appended below: the runner's own bookkeeping
        out_locs.append(loc)
        seq.tokens.append(token)
        seq.kv_locs.append(loc)
        kv_locs.append(torch.tensor(seq.kv_locs, dtype=torch.int64))
        slots.append(seq.slot)
    return ForwardBatch(
        mode="decode",
        input_ids=torch.tensor(ids),
        positions=torch.tensor(positions),
        extend_lens=[1] * len(ids),
        prefix_lens=pre,
        kv_locs=kv_locs,
        out_locs=torch.tensor(out_locs),
        state_slots=torch.tensor(slots),
    )


def clone(buffers: PoolBuffers) -> PoolBuffers:
    return PoolBuffers(*([t.clone() for t in group] for group in (buffers.k, buffers.v, buffers.conv, buffers.ssm)))


def assert_same_step(
    model: HybridModel, runner: SimpleRunner, batch: ForwardBatch, native: NativeDecode | None = None
) -> torch.Tensor:
    native = native or NativeDecode(model)
    torch_buffers, native_buffers = runner.buffers, clone(runner.buffers)
    with torch.inference_mode():
        expected = model(batch, torch_buffers)
        got = native(batch, native_buffers)
    assert got.shape == expected.shape == (batch.batch_size, VOCAB)
    scale = max(1.0, float(expected.abs().max()))
    diff = float((got - expected).abs().max())
    assert diff < 1e-4 * scale, f"logits differ by {diff} (scale {scale})"
    for name in ("k", "v", "conv", "ssm"):
        for i, (a, b) in enumerate(zip(getattr(torch_buffers, name), getattr(native_buffers, name), strict=True)):
            err = float((a - b).abs().max())
            assert err < 1e-5 * max(1.0, float(a.abs().max())), f"{name}[{i}] differs by {err}"
    rows = batch.out_locs
    assert all(float(t[rows].abs().sum()) > 0 for t in native_buffers.k), "the new K rows were not written"
    return expected


def prefilled(model: HybridModel, lengths: list[int], seed: int = 0) -> tuple[SimpleRunner, list[int]]:
    """A runner holding one prefilled sequence per length, in state slots of a random order (a seeded shuffle of
    the free list); returns it and each sequence's next token."""
    runner = SimpleRunner(model, num_state_slots=len(lengths) + 3)
    random.Random(seed).shuffle(runner.free_state_slots)
    nxt = []
    for sid, n in enumerate(lengths):
        runner.add(sid)
        nxt.append(int(runner.extend({sid: prompt(n, 100 + sid)})[-1].argmax()))
    return runner, nxt


def assert_greedy_steps(model: HybridModel, lengths: list[int], seed: int, steps: int, pools: tuple[str, ...]) -> None:
    """`steps` greedy steps of one sequence per length (slots in random order): the native and the torch runner
    pick the same tokens, and the named pools stay equal."""
    torch_runner, nxt = prefilled(model, lengths, seed=seed)
    native_runner, _ = prefilled(model, lengths, seed=seed)
    native = NativeDecode(model)
    want, got = dict(enumerate(nxt)), dict(enumerate(nxt))
    for _ in range(steps):
        tb, nb = decode_batch(torch_runner, want), decode_batch(native_runner, got)
        with torch.inference_mode():
            want = dict(enumerate(model(tb, torch_runner.buffers).argmax(-1).tolist()))
            got = dict(enumerate(native(nb, native_runner.buffers).argmax(-1).tolist()))
        assert got == want
    for group in pools:
        for a, b in zip(getattr(torch_runner.buffers, group), getattr(native_runner.buffers, group), strict=True):
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), group


def assert_generate_parity(hf: object, model: HybridModel, max_new_tokens: int, **generate_kw: object) -> None:
    """Prefill through torch, then native decode steps: the tokens transformers' fp32 generate picks."""
    ids = prompt(30, 3)
    with torch.no_grad():
        ref = hf.generate(  # type: ignore[attr-defined]
            torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, **generate_kw
        )
    expected = ref[0, len(ids) :].tolist()
    runner, _ = prefilled(model, [])
    runner.add(0)
    native = NativeDecode(model)
    got = [int(runner.extend({0: ids})[-1].argmax())]
    while len(got) < len(expected):
        with torch.inference_mode():
            got.append(int(native(decode_batch(runner, {0: got[-1]}), runner.buffers)[0].argmax()))
    assert got == expected


def assert_bf16_bits(model: HybridModel, lengths: list[int], seed: int, steps: int) -> None:
    """Every parameter rounded to bf16, held as fp32 or as bf16 storage read in place: the same logits and pool
    rows, bit for bit, over greedy steps of a batch; and their tokens are the torch decode's on the rounded ones.
    The bf16 GEMMs in their FMA form, which every host without AMX runs (on AMX, runtime/native/amx_gemm.h rounds
    the activations to bf16: tests/runtime/test_native_gemm.py and test_native_decode_bf16.py check that path)."""
    with fma_form(load_library()):
        _assert_bf16_bits(model, lengths, seed, steps)


def _assert_bf16_bits(model: HybridModel, lengths: list[int], seed: int, steps: int) -> None:
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.bfloat16().float())
    half = copy.deepcopy(rounded)
    for p in half.parameters():
        p.data = p.data.bfloat16()
    runner, nxt = prefilled(rounded, lengths, seed=seed)
    torch_runner, _ = prefilled(rounded, lengths, seed=seed)
    fp32_buffers, bf16_buffers = clone(runner.buffers), clone(runner.buffers)
    native32, native16 = NativeDecode(rounded), NativeDecode(half)
    tokens = dict(enumerate(nxt))
    for _ in range(steps):
        batch, tb = decode_batch(runner, tokens), decode_batch(torch_runner, tokens)
        with torch.inference_mode():
            want = native32(batch, fp32_buffers)
            got = native16(batch, bf16_buffers)
            expected = rounded(tb, torch_runner.buffers)
        assert torch.equal(got, want), f"logits differ by {float((got - want).abs().max())}"
        assert float((got - expected).abs().max()) < 1e-4 * max(1.0, float(expected.abs().max()))
        tokens = dict(enumerate(got.argmax(-1).tolist()))
        assert tokens == dict(enumerate(expected.argmax(-1).tolist()))
    for name in ("k", "v", "conv", "ssm"):
        for a, b in zip(getattr(fp32_buffers, name), getattr(bf16_buffers, name), strict=True):
            assert torch.equal(a, b), name


def assert_thread_bits(model: HybridModel, lengths: list[int], seed: int, steps: int) -> None:
    """1 and 2 threads (the projections split down to 4-row blocks): the same logits and pools, bit for bit."""
    native = NativeDecode(model)
    native.threads = None  # the test sets the count
    set_min_part_bytes(native.library, 1)  # split even the tiny projections down to 4-row blocks
    results = []
    try:
        for count in (1, 2):
            set_threads(native.library, count)
            runner, nxt = prefilled(model, lengths, seed=seed)
            tokens, out = dict(enumerate(nxt)), []
            for _ in range(steps):
                with torch.inference_mode():
                    logits = native(decode_batch(runner, tokens), runner.buffers)
                out.append(logits.clone())
                tokens = dict(enumerate(logits.argmax(-1).tolist()))
            b = runner.buffers
            results.append(out + [t.clone() for group in (b.k, b.v, b.conv, b.ssm) for t in group])
    finally:
        set_min_part_bytes(native.library, 32768)
        set_threads(native.library, 1)
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


# (prefix, new tokens, state checkpoints after these token counts, every row's logits): fresh (a garbage slot),
# checkpoints at the chain's first and last row, a speculative verify's all-logits rows, 30 rows after 40 cached (the
# GEMMs' broadcast form; a Mamba2 model's fp32 chains end at 32 tokens, MAMBA2_EXTEND_MAX_TOKENS).
EXTEND_CASES = [(0, 2, (), False), (0, 17, (1, 17), False), (9, 5, (1, 2, 3, 4), True), (40, 30, (5, 29), False)]


def extend_batch(runner: SimpleRunner, sid: int, tokens: list[int], *, all_logits: bool = False) -> ForwardBatch:
    """The extend batch the engine builds for `tokens` appended to sequence `sid` (slots taken from the runner)."""
    seq = runner.seqs[sid]
    start = len(seq.tokens)
    locs = list(range(runner.next_token_slot, runner.next_token_slot + len(tokens)))
    runner.next_token_slot += len(tokens)
    seq.tokens += tokens
    seq.kv_locs += locs
    return ForwardBatch(
        mode="extend",
        input_ids=torch.tensor(tokens, dtype=torch.int64),
        positions=torch.arange(start, start + len(tokens), dtype=torch.int64),
        extend_lens=[len(tokens)],
        prefix_lens=[start],
        kv_locs=[torch.tensor(seq.kv_locs, dtype=torch.int64)],
        out_locs=torch.tensor(locs, dtype=torch.int64),
        state_slots=torch.tensor([seq.slot], dtype=torch.int64),
        all_logits=all_logits,
    )


def _extend_runner(model: HybridModel, prefix: int, slots: int) -> SimpleRunner:
    """Sequence 1 after a torch prefill of `prefix` tokens (none: its slot full of garbage that a fresh extend must
    ignore), sequence 0 holding another slot first."""
    runner = SimpleRunner(model, num_state_slots=slots)
    runner.add(0)
    runner.add(1)
    if prefix:
        runner.extend({1: prompt(prefix, 11)})
    else:
        for buf in (*runner.buffers.conv, *runner.buffers.ssm):
            buf[runner.seqs[1].slot].normal_(generator=torch.Generator().manual_seed(5))
    return runner


def assert_extend_matches_torch(
    model: HybridModel, prefix: int, new: int, after: tuple[int, ...] = (), *, all_logits: bool = False
) -> None:
    """One sequence's `new` tokens after `prefix` cached ones as a native chain against the torch extend: the
    logits (the last row's, or every row's with `all_logits`: a speculative verify), K/V at the new slots, the
    state at the sequence's slot and at a state checkpoint after each of `after`'s token counts (1e-4 relative:
    the decode tests' tolerance), and not one other pool row changed."""
    runner = _extend_runner(model, prefix, slots=3 + len(after))
    batch = extend_batch(runner, 1, prompt(new, 23), all_logits=all_logits)
    own = int(batch.state_slots[0])
    spare = [s for s in range(3 + len(after)) if s not in (own, runner.seqs[0].slot)][: len(after)]
    if after:
        batch.state_checkpoints = [list(zip(after, spare, strict=True))]
    native = NativeDecode(model, extends=True)
    assert native.handles(batch)
    torch_buffers, native_buffers = runner.buffers, clone(runner.buffers)
    with torch.inference_mode():
        expected = model(batch, torch_buffers)
        got = native(batch, native_buffers)
    assert got.shape == expected.shape == (new if all_logits else 1, VOCAB)
    _assert_close("logits", got, expected, 1e-4)
    for name in ("k", "v", "conv", "ssm"):
        rows = batch.out_locs if name in ("k", "v") else torch.tensor([own, *spare])
        for i, (a, b) in enumerate(zip(getattr(torch_buffers, name), getattr(native_buffers, name), strict=True)):
            _assert_close(f"{name}[{i}]", b[rows], a[rows], 1e-4)
            keep = torch.ones(a.shape[0], dtype=torch.bool)
            keep[rows] = False
            assert torch.equal(a[keep], b[keep]), f"{name}[{i}]: a row outside the extend's changed"


def _assert_close(name: str, got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    err = float((got - want).abs().max())
    assert err < rel * max(1.0, float(want.abs().max())), f"{name} differs by {err}"


def assert_extend_thread_bits(model: HybridModel, prefix: int, new: int) -> None:
    """A native extend chain (with a state checkpoint) on 1 and 2 threads, the projections split down to 4-row
    blocks: the same logits and pools, bit for bit."""
    native = NativeDecode(model, extends=True)
    native.threads = None  # the test sets the count
    set_min_part_bytes(native.library, 1)
    results = []
    try:
        for count in (1, 2):
            set_threads(native.library, count)
            runner = _extend_runner(model, prefix, slots=4)
            batch = extend_batch(runner, 1, prompt(new, 4))
            spare = next(s for s in range(4) if s not in (runner.seqs[0].slot, runner.seqs[1].slot))
            batch.state_checkpoints = [[(new // 2, spare)]]
            with torch.inference_mode():
                logits = native(batch, runner.buffers)
            b = runner.buffers
            results.append([logits.clone()] + [t.clone() for group in (b.k, b.v, b.conv, b.ssm) for t in group])
    finally:
        set_min_part_bytes(native.library, 32768)
        set_threads(native.library, 1)
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
