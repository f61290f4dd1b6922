"""The chunked gated-DeltaNet extend kernel (runtime/native/gdn_chunked.c) against the token-by-token short-extend
kernel (itself held to the torch chunked path by tests/runtime/test_short_extend_kernels.py): outputs, final conv
windows and states, and every checkpoint, over random batches with chunks cut short by checkpoints at any token
count; then a bf16 layer's long extend, which takes it, against the fp32 torch path on the same weights."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.models.layers.gated_deltanet import GatedDeltaNet
from runtime.models.layers.packing import SHORT_EXTEND_MAX_TOKENS, SequencePacking
from runtime.native import extend_kernels
from tests.runtime.test_engine_support import one_torch_thread
from tests.runtime.test_short_extend_kernels import SLOTS, _batch, _layer

pytestmark = pytest.mark.skipif(extend_kernels.library() is None, reason="needs a C compiler (CI installs gcc)")

# (nk, value heads per key head, dk, dv); 3 a key head: the chunked kernel shares k.kT between them
HEADS = [(1, 1, 16, 16), (2, 2, 16, 32), (2, 1, 32, 16), (1, 2, 64, 64), (2, 3, 16, 16)]
# Both kernels sum in fp32, in different orders (chunk algebra vs token by token).
ATOL, RTOL = 3e-5, 2e-4


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@st.composite
def _cases(draw: st.DrawFn) -> dict:
    batch = draw(st.integers(1, 3))
    lens = draw(st.lists(st.integers(1, 200), min_size=batch, max_size=batch))
    prefixed = draw(st.lists(st.booleans(), min_size=batch, max_size=batch))
    slots = draw(st.permutations(range(SLOTS)))[: batch + 30]
    state_slots, spare = slots[:batch], slots[batch:]
    ckpts = [[(c, spare.pop()) for c in sorted(draw(st.sets(st.integers(1, n), max_size=min(n, 5))))] for n in lens]
    return {
        "lens": lens, "prefixed": prefixed, "slots": state_slots, "ckpts": ckpts,
        "seed": draw(st.integers(0, 2**16)),
        "heads": draw(st.sampled_from(HEADS)),
        "threads": draw(st.sampled_from([1, 2, 3])),
    }  # fmt: skip


def _kernel_run(case: dict, chunked: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    nk, ratio, dk, dv = case["heads"]
    layer = _layer(case["seed"], nk, ratio, dk, dv, False, True)
    gen = torch.Generator().manual_seed(case["seed"])
    conv = torch.randn(SLOTS, *layer.conv_state_shape, generator=gen)
    ssm = torch.randn(SLOTS, *layer.ssm_state_shape, generator=gen) * 0.2
    x = torch.randn(sum(case["lens"]), 32, generator=gen)
    ckpts = case["ckpts"]
    plan = extend_kernels.ShortExtendPlan.build(
        case["lens"], case["prefixed"], case["slots"],
        [s for s, seq in enumerate(ckpts) for _ in seq], [n for seq in ckpts for n, _ in seq],
        [slot for seq in ckpts for _, slot in seq],
    )  # fmt: skip
    with torch.no_grad():
        mixed, z, b, a = layer._project(x)  # noqa: SLF001 - the layer's own inputs to the kernel
    before = extend_kernels.threads()
    extend_kernels.set_threads(case["threads"] if chunked else 1)
    try:
        out = extend_kernels.gdn_short_extend(
            plan, mixed, z.reshape(len(x), -1), b, a, layer.conv1d.weight[:, 0, :], layer.conv1d.bias, conv, ssm,
            -layer.A_log.exp(), layer.dt_bias, layer.norm.weight, 1e-6, (nk, nk * ratio, dk, dv), chunked=chunked,
        )  # fmt: skip
    finally:
        extend_kernels.set_threads(before)
    return out, conv, ssm


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases())
def test_chunked_kernel_matches_the_token_by_token_kernel(case: dict) -> None:
    want, want_conv, want_ssm = _kernel_run(case, chunked=False)
    got, got_conv, got_ssm = _kernel_run(case, chunked=True)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    assert torch.equal(got_conv, want_conv)  # conv windows: the same copies
    written = case["slots"] + [slot for seq in case["ckpts"] for _, slot in seq]
    torch.testing.assert_close(got_ssm[written], want_ssm[written], atol=ATOL, rtol=RTOL)
    untouched = [s for s in range(SLOTS) if s not in written]
    assert torch.equal(got_ssm[untouched], want_ssm[untouched])


def _layer_forward(layer: GatedDeltaNet, x: torch.Tensor, lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    batch = _batch(lens, [True] * len(lens), list(range(len(lens))), [[] for _ in lens])
    gen = torch.Generator().manual_seed(7)
    conv = torch.randn(SLOTS, *layer.conv_state_shape, generator=gen)
    ssm = torch.randn(SLOTS, *layer.ssm_state_shape, generator=gen) * 0.2
    packing = SequencePacking.build(batch, torch.device("cpu"))
    assert packing.short_extend_plan() is None  # a long batch
    with torch.no_grad():
        out = layer(x, conv, ssm, packing, packing.state_slots)
    return out, ssm


def test_a_bf16_long_extend_takes_the_kernel_and_matches_the_fp32_torch_path() -> None:
    lens = [SHORT_EXTEND_MAX_TOKENS + 37, 90]
    reference = _layer(3, 2, 2, 32, 32, False, False)
    bf16 = _layer(3, 2, 2, 32, 32, False, False)
    with torch.no_grad():
        for name, p in bf16.named_parameters():
            if name not in GatedDeltaNet.fp32_parameters:
                p.data = p.data.bfloat16()
                reference.get_parameter(name).copy_(p.float())  # the same weights, bf16-rounded
    x = torch.randn(sum(lens), 32, generator=torch.Generator().manual_seed(1)).bfloat16()
    calls: list[int] = []
    kernel = extend_kernels.gdn_short_extend

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(int(bool(kwargs.get("chunked"))))
        return kernel(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(extend_kernels, "gdn_short_extend", counted)
        got, got_ssm = _layer_forward(bf16, x, lens)
    assert calls == [1]  # the chunked kernel ran, once for the batch
    want, want_ssm = _layer_forward(reference, x.float(), lens)
    assert got.dtype == torch.bfloat16
    # bf16 projections on both sides of the kernel: a relative error of bf16's order overall, not per element
    assert (got.float() - want).norm() <= 2e-2 * want.norm()
    assert (got_ssm[:2] - want_ssm[:2]).norm() <= 2e-2 * want_ssm[:2].norm()


def test_bf16_inputs_give_the_bits_of_their_fp32_widening() -> None:
    """mixed and z as bf16 are widened exactly as the kernel reads them: the same bits as fp32 copies of them."""
    layer = _layer(5, 2, 2, 32, 32, False, True)
    lens = [150, 70]
    plan = extend_kernels.ShortExtendPlan.build(lens, [True, False], [0, 1], [0], [100], [2])
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(sum(lens), 32, generator=gen)
    conv = torch.randn(SLOTS, *layer.conv_state_shape, generator=gen)
    ssm = torch.randn(SLOTS, *layer.ssm_state_shape, generator=gen) * 0.2
    with torch.no_grad():
        mixed, z, b, a = layer._project(x)  # noqa: SLF001 - the layer's own inputs to the kernel
    mixed16, z16 = mixed.bfloat16(), z.reshape(len(x), -1).bfloat16()

    def run(m: torch.Tensor, zz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c, s = conv.clone(), ssm.clone()
        out = extend_kernels.gdn_short_extend(
            plan, m, zz, b, a, layer.conv1d.weight[:, 0, :], layer.conv1d.bias, c, s, -layer.A_log.exp(),
            layer.dt_bias, layer.norm.weight, 1e-6, (2, 4, 32, 32), chunked=True,
        )  # fmt: skip
        return out, c, s

    for got, want in zip(run(mixed16, z16), run(mixed16.float(), z16.float()), strict=True):
        assert torch.equal(got, want)
    with pytest.raises(extend_kernels.NativeRefused, match="bfloat16"):  # token by token: fp32 only
        extend_kernels.gdn_short_extend(
            plan, mixed16, z16, b, a, layer.conv1d.weight[:, 0, :], layer.conv1d.bias, conv, ssm,
            -layer.A_log.exp(), layer.dt_bias, layer.norm.weight, 1e-6, (2, 4, 32, 32),
        )  # fmt: skip
