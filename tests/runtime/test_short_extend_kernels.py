"""The short-extend C kernels against the torch paths they replace, at the layer level. runtime/native/
extend_kernels.c: a gated-DeltaNet layer's output, the final conv windows and recurrent states, and every state
checkpoint (prefix-cache checkpoints, a verify round's per-draft states) over random batches: lengths, cached
prefixes or none, checkpoints at any token count, grouped heads, both projection layouts. runtime/native/
moe_kernels.c: a sparse MoE block's routed and shared experts over random shapes and routings."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.core.batch import ForwardBatch
from runtime.models.layers import moe as moe_layer
from runtime.models.layers.gated_deltanet import GatedDeltaNet
from runtime.models.layers.moe import SparseMoE
from runtime.models.layers.norm import ZeroCenteredRMSNorm
from runtime.models.layers.packing import SHORT_EXTEND_MAX_TOKENS, SequencePacking
from runtime.native import extend_kernels
from tests.runtime.test_engine_support import one_torch_thread

pytestmark = pytest.mark.skipif(extend_kernels.library() is None, reason="needs a C compiler (CI installs gcc)")

# The kernel runs the recurrence token by token; the chunked path sums the same terms in another order (the UT
# transform, the chunk state), so they agree to fp32 rounding, not bit for bit.
ATOL, RTOL = 2e-5, 1e-4
REPO = Path(__file__).resolve().parents[2]
SLOTS = 48


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _layer(seed: int, nk: int, ratio: int, dk: int, dv: int, split: bool, bias: bool) -> GatedDeltaNet:
    torch.manual_seed(seed)
    layer = GatedDeltaNet(32, nk, nk * ratio, dk, dv, 4, 1e-6, split_projections=split)
    if bias:
        layer.conv1d.bias = torch.nn.Parameter(torch.randn(layer.conv_dim) * 0.1)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        layer.A_log.copy_(torch.randn(nk * ratio) * 0.5)
        layer.dt_bias.copy_(torch.randn(nk * ratio))
    layer.after_weights_loaded()
    return layer


def _batch(lens: list[int], prefixed: list[bool], slots: list[int], ckpts: list[list[tuple[int, int]]]) -> ForwardBatch:
    tokens = sum(lens)
    return ForwardBatch(
        mode="extend",
        input_ids=torch.zeros(tokens, dtype=torch.int64),
        positions=torch.zeros(tokens, dtype=torch.int64),
        extend_lens=lens,
        prefix_lens=[5 if p else 0 for p in prefixed],
        kv_locs=[],
        out_locs=torch.zeros(tokens, dtype=torch.int64),
        state_slots=torch.tensor(slots, dtype=torch.int64),
        state_checkpoints=ckpts if any(ckpts) else None,
    )


@contextlib.contextmanager
def _counting(kernel_name: str) -> Iterator[list[int]]:
    """Within the block, each call of extend_kernels.<kernel_name> appends to the list it yields (the kernel still
    runs): proof that the layer ran the kernel rather than refusing into its torch path."""
    kernel = getattr(extend_kernels, kernel_name)
    calls: list[int] = []

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        out = kernel(*args, **kwargs)
        calls.append(1)
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(extend_kernels, kernel_name, counted)
        yield calls


def _run(layer: GatedDeltaNet, x: torch.Tensor, batch: ForwardBatch, pools: tuple[torch.Tensor, torch.Tensor],
         native: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    conv, ssm = pools[0].clone(), pools[1].clone()
    packing = SequencePacking.build(batch, torch.device("cpu"))
    if native:
        assert packing.short_extend_plan() is not None
    else:
        packing.host = None  # a long batch to the layer: the chunked path, in torch, not gdn_chunked.c
        layer.native_long_extend = False
    counting: contextlib.AbstractContextManager[list[int]] = (
        _counting("gdn_short_extend") if native else contextlib.nullcontext([])
    )
    try:
        with torch.no_grad(), counting as calls:
            out = layer(x, conv, ssm, packing, packing.state_slots)
    finally:
        layer.native_long_extend = True
    assert len(calls) == int(native)  # the kernel ran (not refused into the torch path)
    return out, conv, ssm


@st.composite
def _cases(draw: st.DrawFn) -> dict:
    batch = draw(st.integers(1, 4))
    lens = draw(st.lists(st.integers(1, SHORT_EXTEND_MAX_TOKENS // 4), min_size=batch, max_size=batch))
    prefixed = draw(st.lists(st.booleans(), min_size=batch, max_size=batch))
    slots = draw(st.permutations(range(SLOTS)))[: batch + 40]
    state_slots, spare = slots[:batch], slots[batch:]
    ckpts: list[list[tuple[int, int]]] = []
    for n in lens:
        counts = sorted(draw(st.sets(st.integers(1, n), max_size=min(n, 6))))
        ckpts.append([(c, spare.pop()) for c in counts])
    return {
        "lens": lens, "prefixed": prefixed, "slots": state_slots, "ckpts": ckpts,
        "seed": draw(st.integers(0, 2**16)),
        "heads": draw(st.sampled_from([(1, 1, 16, 16), (2, 2, 16, 32), (2, 1, 32, 16), (1, 4, 8, 8)])),
        "split": draw(st.booleans()), "bias": draw(st.booleans()),
    }  # fmt: skip


def _case_inputs(case: dict) -> tuple[GatedDeltaNet, torch.Tensor, torch.Tensor, ForwardBatch, torch.Tensor]:
    """A drawn case's layer, conv and SSM pools, batch and input rows (random from the case's seed)."""
    nk, ratio, dk, dv = case["heads"]
    layer = _layer(case["seed"], nk, ratio, dk, dv, case["split"], case["bias"])
    gen = torch.Generator().manual_seed(case["seed"])
    conv = torch.randn(SLOTS, *layer.conv_state_shape, generator=gen)
    ssm = torch.randn(SLOTS, *layer.ssm_state_shape, generator=gen) * 0.2
    batch = _batch(case["lens"], case["prefixed"], case["slots"], case["ckpts"])
    x = torch.randn(sum(case["lens"]), 32, generator=gen)
    return layer, conv, ssm, batch, x


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases())
def test_short_extend_matches_the_chunked_path(case: dict) -> None:
    layer, conv, ssm, batch, x = _case_inputs(case)
    want, want_conv, want_ssm = _run(layer, x, batch, (conv, ssm), False)
    got, got_conv, got_ssm = _run(layer, x, batch, (conv, ssm), True)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    written = case["slots"] + [slot for seq in case["ckpts"] for _, slot in seq]
    for slot in written:  # final states and every checkpoint
        torch.testing.assert_close(got_conv[slot], want_conv[slot], atol=0, rtol=0)  # copies: exact
        torch.testing.assert_close(got_ssm[slot], want_ssm[slot], atol=ATOL, rtol=RTOL)
    untouched = [s for s in range(SLOTS) if s not in written]
    assert torch.equal(got_conv[untouched], conv[untouched]) and torch.equal(got_ssm[untouched], ssm[untouched])


@contextlib.contextmanager
def _pool_threads(n: int) -> Iterator[None]:
    """The kernels' worker pool on n threads."""
    before = extend_kernels.threads()
    extend_kernels.set_threads(n)
    try:
        yield
    finally:
        extend_kernels.set_threads(before)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases(), threads=st.sampled_from([2, 3]))
def test_short_extend_gives_the_same_bits_on_any_thread_count(case: dict, threads: int) -> None:
    """The kernel splits tokens (conv, gates) and value heads (recurrence, checkpoints) over the worker pool; each
    is computed the same way on any thread, so outputs, states and checkpoints are identical to one thread's. (The
    kernel alone: torch's own projections may round differently on another thread count.)"""
    nk, ratio, dk, dv = case["heads"]
    layer, conv, ssm, batch, x = _case_inputs(case)
    plan = SequencePacking.build(batch, torch.device("cpu")).short_extend_plan()
    assert plan is not None
    with torch.no_grad():
        mixed, z, b, a = layer._project(x)  # noqa: SLF001 - the layer's own inputs to the kernel
    heads = (nk, nk * ratio, dk, dv)
    norm = (-layer.A_log.exp(), layer.dt_bias, layer.norm.weight, 1e-6, heads)

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c, m = conv.clone(), ssm.clone()
        weight = layer.conv1d.weight[:, 0, :]
        out = extend_kernels.gdn_short_extend(plan, mixed, z.reshape(len(x), -1), b, a, weight, layer.conv1d.bias,
                                              c, m, *norm)  # fmt: skip
        return out, c, m

    with torch.no_grad():
        with _pool_threads(1):
            one = run()
        with _pool_threads(threads):
            many = run()
    for got, want in zip(many, one, strict=True):
        assert torch.equal(got, want)


def test_a_long_extend_takes_the_chunked_path() -> None:
    batch = _batch([SHORT_EXTEND_MAX_TOKENS + 1], [True], [0], [[]])
    assert SequencePacking.build(batch, torch.device("cpu")).short_extend_plan() is None
    short = _batch([SHORT_EXTEND_MAX_TOKENS // 2] * 2, [True, False], [0, 1], [[], []])
    assert SequencePacking.build(short, torch.device("cpu")).short_extend_plan() is not None


def test_shared_slots_are_refused_not_run() -> None:
    """Two sequences on one slot, or a checkpoint into a sequence's own slot: the in-place kernel would not do
    what the torch path does, so the plan is refused and the torch path runs."""
    shared = _batch([3, 3], [True, True], [4, 4], [[], []])
    assert SequencePacking.build(shared, torch.device("cpu")).short_extend_plan() is None
    onto_own = _batch([3], [True], [4], [[(2, 4)]])
    assert SequencePacking.build(onto_own, torch.device("cpu")).short_extend_plan() is None


def test_tensors_that_do_not_fit_are_refused_before_the_call() -> None:
    layer = _layer(0, 2, 2, 16, 16, False, False)
    batch = _batch([4], [True], [2], [[]])
    packing = SequencePacking.build(batch, torch.device("cpu"))
    plan = packing.short_extend_plan()
    assert plan is not None
    conv = torch.zeros(SLOTS, *layer.conv_state_shape)
    ssm = torch.zeros(SLOTS, *layer.ssm_state_shape)
    x = torch.randn(4, 32)
    mixed, z, b, a = layer._project(x)  # noqa: SLF001 - the layer's own inputs to the kernel
    weight = layer.conv1d.weight[:, 0, :]
    heads = (2, 4, 16, 16)
    args = (layer.conv1d.bias, conv, ssm, -layer.A_log.exp(), layer.dt_bias, layer.norm.weight, 1e-6, heads)
    z2 = z.reshape(4, -1)
    with pytest.raises(extend_kernels.NativeRefused, match="float64"):
        extend_kernels.gdn_short_extend(plan, mixed.double(), z2, b, a, weight, *args)
    with pytest.raises(extend_kernels.NativeRefused, match="shape"):
        extend_kernels.gdn_short_extend(plan, mixed[:3], z2, b, a, weight, *args)
    with pytest.raises(extend_kernels.NativeRefused, match="strides"):
        extend_kernels.gdn_short_extend(plan, mixed.t().contiguous().t(), z2, b, a, weight, *args)
    small = (layer.conv1d.bias, conv[:2], ssm[:2], *args[3:])
    with pytest.raises(extend_kernels.NativeRefused, match="outside pools"):
        extend_kernels.gdn_short_extend(plan, mixed, z2, b, a, weight, *small)
    with pytest.raises(extend_kernels.NativeRefused, match="conv_pool"):
        extend_kernels.gdn_short_extend(plan, mixed, z2, b, a, weight, layer.conv1d.bias, conv.half(), *args[2:])


def _random_moe(shape: tuple[int, ...], seed: int) -> SparseMoE:
    """A SparseMoE of `shape` (experts, top_k, hidden, intermediate, shared intermediate) with random weights."""
    experts, top_k, hidden, inter, shared = shape
    torch.manual_seed(seed)
    moe = SparseMoE(hidden, experts, top_k, inter, shared, norm_topk_prob=True)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return moe


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tokens=st.integers(2, moe_layer.SHORT_EXTEND_MAX_TOKENS),
    shape=st.sampled_from([(8, 2, 32, 16, 16), (4, 1, 24, 12, 0), (16, 4, 40, 8, 24), (3, 2, 13, 5, 7)]),
    seed=st.integers(0, 2**16),
)
def test_short_extend_moe_matches_the_torch_experts(tokens: int, shape: tuple[int, ...], seed: int) -> None:
    """The routed experts and the shared expert in C against SparseMoE's torch path (sorted or dense dispatch),
    including sizes that are not multiples of the kernel's 4 x 4 x 8 blocks."""
    experts, top_k, hidden, inter, shared = shape
    moe = _random_moe(shape, seed)
    x = torch.randn(tokens, hidden)
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(moe_layer, "ROWS_MIN_TOKENS", 1 << 62)  # torch's ops, not moe_rows.c
        want = moe(x)
        with _counting("moe_short_extend") as calls:
            got = moe(x, short_extend=True)
    assert calls == [1]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("nan_rows", [[0], [1, 3], [0, 1, 2, 3, 4]])
def test_a_nan_hidden_state_routes_without_harm_to_the_server(nan_rows: list[int]) -> None:
    """A NaN in a token's hidden state makes all its router probabilities NaN: the C router must still pick k
    distinct experts in range (NaN out for that token, as torch gives), never an id that indexes out of bounds
    (which corrupted the heap and killed the server); the other tokens are untouched."""
    moe = _random_moe((8, 2, 32, 16, 16), 7)
    with torch.no_grad():
        x = torch.randn(6, 32)
        x[nan_rows, 3] = float("nan")
        want = moe(x)
        got = moe(x, short_extend=True)
    clean = [r for r in range(6) if r not in nan_rows]
    assert torch.isnan(got[nan_rows]).all()
    torch.testing.assert_close(got[clean], want[clean], atol=ATOL, rtol=RTOL)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tokens=st.integers(2, moe_layer.SHORT_EXTEND_MAX_TOKENS),
    shape=st.sampled_from([(8, 2, 256, 128, 128), (4, 1, 24, 12, 0), (16, 4, 40, 8, 24), (3, 2, 13, 5, 7)]),
    threads=st.sampled_from([2, 3]),
    seed=st.integers(0, 2**16),
)
def test_short_extend_moe_gives_the_same_bits_on_any_thread_count(
    tokens: int, shape: tuple[int, ...], threads: int, seed: int
) -> None:
    """The MoE kernel's units (expert, 4 output rows, 3 token rows) are split over the worker pool; each unit is
    computed the same way on any thread, so the block's output is identical to one thread's (the kernel alone, the
    router's routing fixed)."""
    experts, top_k, hidden, inter, shared = shape
    moe = _random_moe(shape, seed)
    with torch.no_grad():
        x = torch.randn(tokens, hidden)
        weights, ids = moe.gate(x)
        mlp, gate = moe.shared_expert, moe.shared_expert_gate
        both = None if mlp is None or gate is None else (mlp.gate_proj.weight, mlp.up_proj.weight,
                                                         mlp.down_proj.weight, gate.weight[0])  # fmt: skip
        args = (x, ids, weights, moe.experts.gate_up_proj, moe.experts.down_proj, both)
        with _pool_threads(1):
            one = extend_kernels.moe_short_extend(*args)
        with _pool_threads(threads):
            many = extend_kernels.moe_short_extend(*args)
    assert torch.equal(many, one)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 64), dim=st.sampled_from([8, 13, 64, 256]), seed=st.integers(0, 2**16))
def test_short_extend_rms_norm_matches_f_rms_norm(rows: int, dim: int, seed: int) -> None:
    """Qwen3-Next's zero-centred RMSNorm of a short extend's rows in C, strided rows included."""
    torch.manual_seed(seed)
    norm = ZeroCenteredRMSNorm(dim, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim) * 0.5)
    wide = torch.randn(rows, dim + 3) * 3
    x = wide[:, :dim]  # rows apart by dim + 3
    with torch.no_grad():
        want = norm(x)
        with _counting("rms_norm") as calls:
            got = norm(x, short_extend=True)
    assert calls == [1]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


def test_without_the_library_short_extends_take_the_torch_path_and_say_why_once(tmp_path: Path) -> None:
    """HYBRIDCTL_NATIVE=0 (or no compiler): the kernels are refused, one warning names the reason, and a short
    extend still runs (the chunked path)."""
    script = (
        "import logging, torch\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "from tests.runtime.test_short_extend_kernels import _batch, _layer\n"
        "from runtime.models.layers.packing import SequencePacking\n"
        "from runtime.native import extend_kernels\n"
        "layer = _layer(0, 2, 2, 16, 16, False, False)\n"
        "packing = SequencePacking.build(_batch([5], [True], [1], [[(3, 2)]]), torch.device('cpu'))\n"
        "conv, ssm = torch.zeros(4, *layer.conv_state_shape), torch.zeros(4, *layer.ssm_state_shape)\n"
        "with torch.no_grad():\n"
        "    out = layer(torch.randn(5, 32), conv, ssm, packing, packing.state_slots)\n"
        "assert extend_kernels.library() is None and out.shape == (5, 32) and ssm[2].abs().sum() > 0\n"
        "print('reason:', extend_kernels.unavailable_reason())\n"
    )
    env = {**os.environ, "HYBRIDCTL_NATIVE": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reason: native kernels are off (HYBRIDCTL_NATIVE=0)" in done.stdout
    warnings = [line for line in done.stderr.splitlines() if "short-extend C kernels" in line]
    assert len(warnings) == 1 and "torch path" in warnings[0], done.stderr[-3000:]
