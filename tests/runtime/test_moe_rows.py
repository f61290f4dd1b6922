"""runtime/native/moe_rows.c: an fp32 prefill's sparse MoE block in one C call against SparseMoE's and Experts'
torch paths over random shapes (sizes off the kernel's 12 x 32 tiles and 16-feature panels, top-k 1 to 8, experts
no token picks), on any thread count, and its plain-C build against this host's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from runtime.models.layers import moe as moe_layer
from runtime.models.layers.moe import SparseMoE
from runtime.native import build, extend_kernels, moe_rows
from tests.runtime.test_engine_support import one_torch_thread

pytestmark = pytest.mark.skipif(extend_kernels.library() is None, reason="needs a C compiler (CI installs gcc)")

# The kernel's dot products run as one FMA chain over k; torch's GEMMs sum in other orders: fp32 rounding apart.
ATOL, RTOL = 2e-5, 1e-4
# (tokens, experts, top_k, hidden, intermediate, shared intermediate)
SHAPES = [
    (2, 8, 2, 256, 128, 128),  # the demo model's block at the kernel's smallest token count
    (65, 8, 2, 256, 128, 128),
    (300, 8, 2, 256, 128, 128),
    (97, 5, 1, 33, 17, 9),  # every size off the tiles and panels
    (130, 16, 8, 40, 8, 24),
    (77, 3, 3, 13, 5, 0),  # top-k = all experts, no shared expert
    (200, 7, 2, 64, 48, 200),  # a shared expert wider than the routed ones
]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


def _random_moe(shape: tuple[int, ...], seed: int) -> SparseMoE:
    _, experts, top_k, hidden, inter, shared = shape
    torch.manual_seed(seed)
    moe = SparseMoE(hidden, experts, top_k, inter, shared, norm_topk_prob=seed % 2 == 0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn_like(p) * 0.5 / p.shape[-1] ** 0.5)
    return moe


def _torch_path(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(moe_layer, "ROWS_MIN_TOKENS", 1 << 62)
        return moe(x)


def _counted() -> tuple[list[int], object]:
    calls: list[int] = []
    kernel = moe_rows.moe_rows

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return kernel(*args, **kwargs)

    return calls, counted


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_block_matches_the_torch_path(shape: tuple[int, ...], seed: int) -> None:
    """Router (softmax, top-k, renormalized or not), routed experts and the sigmoid-gated shared expert: the C
    call that SparseMoE makes against its torch ops. A token with a NaN-free hidden state far off the others'
    scale (row 0 x 8) checks that the router reads each token's own row."""
    moe = _random_moe(shape, seed)
    x = torch.randn(shape[0], shape[3])
    x[0] *= 8
    calls, counted = _counted()
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        want = _torch_path(moe, x)
        patch.setattr(moe_rows, "moe_rows", counted)
        patch.setattr(moe_rows, "vectorized", lambda: True)  # a host without AVX-512: its plain-C tiles
        got = moe(x)
    assert calls == [1]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_given_routing_with_experts_left_empty(shape: tuple[int, ...]) -> None:
    """Routing given as ids and weights (any router's), only the even experts ever picked: the odd ones get no
    rows. Experts.forward's C call against Experts.forward_sparse, the torch dispatch."""
    tokens, experts, top_k, hidden, inter, _ = shape
    moe = _random_moe(shape, 3)
    used = list(range(0, experts, 2))
    k = min(top_k, len(used))
    gen = torch.Generator().manual_seed(5)
    ids = torch.stack([torch.tensor(used)[torch.randperm(len(used), generator=gen)[:k]] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=gen)
    x = torch.randn(tokens, hidden, generator=gen)
    calls, counted = _counted()
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        want = moe.experts.forward_sparse(x, ids, weights)
        patch.setattr(moe_rows, "moe_rows", counted)
        patch.setattr(moe_rows, "vectorized", lambda: True)
        got = moe.experts(x, ids, weights)  # as Kimi-Linear's block calls them, with its own router's routing
    assert calls == [1]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


def _block_args(moe: SparseMoE) -> dict:
    mlp, gate = moe.shared_expert, moe.shared_expert_gate
    args = {"router": extend_kernels.Router(moe.gate.weight, moe.gate.top_k, moe.gate.norm_topk_prob)}
    if mlp is not None and gate is not None:
        args["shared"] = moe_rows.pack_shared(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
        args["shared_gate"] = gate.weight[0]
    return args


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("threads", [2, 3])
def test_any_thread_count_gives_the_same_bits(shape: tuple[int, ...], threads: int) -> None:
    """Threads take token ranges; every row's chains are the same wherever its tile, chunk or thread falls."""
    moe = _random_moe(shape, 2)
    x = torch.randn(shape[0], shape[3])
    before = extend_kernels.threads()
    with torch.no_grad():
        packed = moe_rows.pack_experts(moe.experts.gate_up_proj, moe.experts.down_proj)
        try:
            extend_kernels.set_threads(1)
            one = moe_rows.moe_rows(x, packed, **_block_args(moe))
            extend_kernels.set_threads(threads)
            many = moe_rows.moe_rows(x, packed, **_block_args(moe))
        finally:
            extend_kernels.set_threads(before)
    assert torch.equal(many, one)


def test_the_plain_c_build_computes_the_same_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library built without AVX2, FMA or AVX-512 (a CPU without them): the plain-C tiles. Its silu rounds
    apart from the vector one, so close, not equal."""
    flags = (*(f for f in extend_kernels.FLAGS if f != "-march=native"), "-mno-avx2", "-mno-fma")
    plain = build.load("short_extend_plain_c", extend_kernels.SOURCE, flags)
    extend_kernels._setup(plain)  # noqa: SLF001 - the same argument declarations as the host's build
    assert plain.lib.moe_rows_vectorized() == 0  # so the layers keep torch's path on such a CPU
    if "avx512f" in build._cpu_signature().split():  # noqa: SLF001 - the flags -march=native builds for
        assert moe_rows.vectorized()
    for shape in SHAPES[1:4]:
        moe = _random_moe(shape, 4)
        x = torch.randn(shape[0], shape[3])
        with torch.no_grad():
            packed = moe_rows.pack_experts(moe.experts.gate_up_proj, moe.experts.down_proj)
            native = moe_rows.moe_rows(x, packed, **_block_args(moe))
            with monkeypatch.context() as patch:
                patch.setattr(moe_rows, "library", lambda: plain)
                got = moe_rows.moe_rows(x, packed, **_block_args(moe))
        torch.testing.assert_close(got, native, atol=1e-6, rtol=1e-5)


def test_tensors_that_do_not_fit_are_refused() -> None:
    moe = _random_moe(SHAPES[3], 0)  # H 33
    packed = moe_rows.pack_experts(moe.experts.gate_up_proj, moe.experts.down_proj)
    router = extend_kernels.Router(moe.gate.weight, 1, True)
    with pytest.raises(extend_kernels.NativeRefused, match="x must be"):
        moe_rows.moe_rows(torch.randn(4, 32), packed, router=router)
    with pytest.raises(extend_kernels.NativeRefused, match="outside"):
        moe_rows.moe_rows(torch.randn(4, 33), packed, ids=torch.full((4, 1), 5), weights=torch.ones(4, 1))
    with pytest.raises(extend_kernels.NativeRefused, match="fp32"):
        moe_rows.pack_experts(moe.experts.gate_up_proj.bfloat16(), moe.experts.down_proj)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(moe_layer, "ROWS_MAX_PACKED_BYTES", 1024)
        with pytest.raises(extend_kernels.NativeRefused, match="too large"):
            moe.experts.packed()
        x = torch.randn(70, 33)
        with torch.no_grad():  # the block then runs torch's ops
            torch.testing.assert_close(moe(x), _torch_path(moe, x))
