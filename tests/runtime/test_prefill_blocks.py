"""Long extends run their conv and SSD scan in blocks of time steps (runtime/models/layers/conv.py BLOCK_STEPS,
ssd.py BLOCK_TOKENS) so fp32 intermediates stay cache-sized; the result must not depend on the block size."""

from __future__ import annotations

import pytest
import torch

from runtime.core.batch import ForwardBatch
from runtime.models.layers import conv, ssd
from runtime.models.layers.packing import SequencePacking

LENS = [300, 170]  # a padded batch: the second sequence ends inside the first's blocks


def _packing() -> SequencePacking:
    total = sum(LENS)
    batch = ForwardBatch(
        mode="extend",
        input_ids=torch.zeros(total, dtype=torch.int64),
        positions=torch.zeros(total, dtype=torch.int64),
        extend_lens=LENS,
        prefix_lens=[5, 0],  # the first continues a cached state, the second starts from zeros
        kv_locs=[],
        out_locs=torch.zeros(total, dtype=torch.int64),
        state_slots=torch.tensor([1, 2]),
        state_checkpoints=[[(2, 3), (64, 4), (255, 5)], [(170, 6)]],
    )
    return SequencePacking.build(batch, torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_extend_agrees_whatever_the_block(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same operations per element; only torch's vector/tail split of a loop (fused multiply-add or not)
    can move an fp32 result by one ulp, and so one bf16 rounding."""
    g = torch.Generator().manual_seed(0)
    channels, kernel = 24, 4
    x = torch.randn(sum(LENS), channels, generator=g).to(dtype)
    weight, bias = torch.randn(channels, kernel, generator=g).to(dtype), torch.randn(channels, generator=g).to(dtype)
    start_pool = torch.randn(8, channels, kernel - 1, generator=g)
    runs = []
    for steps in (7, 64, 4096):
        monkeypatch.setattr(conv, "BLOCK_STEPS", steps)
        pool = start_pool.clone()
        runs.append((conv.causal_conv1d_extend(x, weight, bias, pool, _packing()), pool))
    for out, pool in runs[1:]:
        assert torch.allclose(out.float(), runs[0][0].float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6)
        assert torch.equal(pool, runs[0][1])
    # The whole-sequence reference: F.conv1d over [old window | new inputs] of the first sequence.
    full = torch.cat([start_pool[1], x[: LENS[0]].float().T], dim=1)[None]
    ref = torch.nn.functional.conv1d(full, weight.float()[:, None], bias.float(), groups=channels)[0].T
    assert (runs[0][0][: LENS[0]].float() - torch.nn.functional.silu(ref).to(dtype).float()).abs().max() < 1e-2
    assert torch.equal(runs[0][1][1], x[LENS[0] - 3 : LENS[0]].float().T)  # the new window: its last 3 inputs


def test_ssd_scan_agrees_whatever_the_block_and_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(0)
    batch, length, heads, dim, groups, size = 2, 300, 4, 8, 2, 16
    x = torch.randn(batch, length, heads, dim, generator=g)
    dt = torch.rand(batch, length, heads, generator=g) * 0.2
    dt[1, 170:] = 0  # padded steps
    a, d = -torch.rand(heads, generator=g) * 4, torch.randn(heads, generator=g)
    b, c = torch.randn(batch, length, groups, size, generator=g), torch.randn(batch, length, groups, size, generator=g)
    init = torch.randn(batch, heads, dim, size, generator=g)
    cps = _packing().checkpoints
    runs = []
    for block, chunk in ((32, 16), (256, 64), (4096, 64), (4096, 128)):
        monkeypatch.setattr(ssd, "BLOCK_TOKENS", block)
        monkeypatch.setattr(ssd, "MAX_CHUNK", chunk)
        captured: list[torch.Tensor] = []
        y, state = ssd.chunk_scan(x, dt, a, b, c, d, init, 128, checkpoints=cps, captured=captured)
        runs.append((y, state, torch.stack(captured)))
    # Token by token, the recurrence itself.
    h = init.clone()
    ys, steps = [], torch.zeros(batch, length, heads, dim)
    for t in range(length):
        steps[:, t], h = ssd.recurrent_step(x[:, t], dt[:, t], a, b[:, t], c[:, t], d, h)
        ys.append(h.clone())
    for y, state, captured in runs:
        assert (y[0] - steps[0]).abs().max() < 1e-4 and (y[1, :170] - steps[1, :170]).abs().max() < 1e-4
        assert (state - h).abs().max() < 1e-4
        want = torch.stack([ys[1][0], ys[63][0], ys[254][0], ys[169][1]])
        assert (captured - want).abs().max() < 1e-4
