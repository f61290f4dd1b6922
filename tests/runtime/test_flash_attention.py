"""The long extends' fp32 causal attention in C (runtime/native/flash_attention.c) against a float64 reference:
rows not a multiple of a unit's block, cached prefixes, head sizes 64/128/256, GQA groups of 1/2/4/8 (and one that
does not divide the 32 lanes), the output gate; bit-identical under 1 and 2 threads; the plain-C build (no AVX-512)
too; paged_attention's extend through it against its SDPA path, with and without a cached prefix; and the q/k
prologue (per-head RMSNorm, partial or full RoPE) against the torch ops it replaces."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime.models.layers.attention import AttentionMetadata, paged_attention
from runtime.models.layers.rotary import RotaryEmbedding
from runtime.native import build, extend_kernels, flash_attention

pytestmark = pytest.mark.skipif(build.find_compiler() is None, reason="needs a C compiler (CI installs gcc)")

# (new rows, cached prefix, query heads, KV heads, head size)
SHAPES = [
    (1, 0, 4, 2, 64),
    (37, 0, 4, 2, 64),
    (100, 13, 8, 1, 128),
    (65, 200, 2, 2, 256),
    (129, 70, 8, 8, 64),
    (70, 5, 16, 4, 64),
    (33, 0, 32, 4, 128),
    (20, 9, 6, 2, 64),  # a group of 3: 30 of the 32 lanes live
]


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    tokens, keys = q.shape[0], k.shape[0]
    allowed = torch.arange(keys)[None, :] <= torch.arange(tokens)[:, None] + (keys - tokens)
    heads = [x.double().transpose(0, 1)[None] for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*heads, attn_mask=allowed, scale=q.shape[-1] ** -0.5, enable_gqa=True)
    out = out[0].transpose(0, 1)
    return out if gate is None else out * torch.sigmoid(gate.double())


def _inputs(shape: tuple[int, int, int, int, int], seed: int = 0) -> tuple[torch.Tensor, ...]:
    tokens, prefix, heads, kv_heads, dim = shape
    gen = torch.Generator().manual_seed(seed)
    # q and the gate as the model has them: views into one [T, H, 2D] projection (heads 2D apart)
    qg = torch.randn(tokens, heads, 2 * dim, generator=gen)
    k = torch.randn(prefix + tokens, kv_heads, dim, generator=gen)
    v = torch.randn(prefix + tokens, kv_heads, dim, generator=gen)
    return qg[..., :dim], k, v, qg[..., dim:]


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = extend_kernels.threads()
    yield
    extend_kernels.set_threads(before)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gated", [False, True])
def test_matches_float64_and_any_thread_count(shape: tuple[int, int, int, int, int], gated: bool, two_threads: None):
    q, k, v, gate = _inputs(shape)
    gate = gate if gated else None
    extend_kernels.set_threads(1)
    one = flash_attention.causal_attention(q, k, v, q.shape[-1] ** -0.5, gate)
    extend_kernels.set_threads(2)
    two = flash_attention.causal_attention(q, k, v, q.shape[-1] ** -0.5, gate)
    assert torch.equal(one, two)
    torch.testing.assert_close(one.double(), _reference(q, k, v, gate), rtol=1e-5, atol=2e-6)


def test_plain_c_build_matches_float64(tmp_path: Path):
    plain = tuple(f for f in build.DEFAULT_FLAGS if f != "-march=native") + ("-mno-avx2", "-mno-fma")
    source = Path(flash_attention.__file__).with_name("flash_attention.c")
    lib = build.load(f"flash_attention_plain_{tmp_path.name}", source, (*plain, "-ffp-contract=fast")).lib
    fn = lib.flash_attention_fp32
    fn.argtypes, fn.restype = extend_kernels.FUNCTIONS["flash_attention_fp32"], ctypes.c_int
    for shape in SHAPES[1:4]:
        q, k, v, gate = _inputs(shape, seed=1)
        (tokens, heads, dim), (keys, kv_heads, _) = q.shape, k.shape
        out = torch.empty(tokens, heads, dim)
        rc = fn(
            tokens, keys, heads, kv_heads, dim, dim, q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(),
            k.stride(0), v.data_ptr(), v.stride(0), gate.data_ptr(), gate.stride(0), gate.stride(1), dim**-0.5,
            out.data_ptr(),
        )  # fmt: skip
        assert rc == 0
        torch.testing.assert_close(out.double(), _reference(q, k, v, gate), rtol=1e-5, atol=2e-6)


def test_refuses_what_it_does_not_take():
    q, k, v, _ = _inputs((8, 0, 4, 2, 64))
    with pytest.raises(extend_kernels.NativeRefused):
        flash_attention.causal_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 0.125)
    with pytest.raises(extend_kernels.NativeRefused):  # fewer keys than queries
        flash_attention.causal_attention(q, k[:4], v[:4], 0.125)
    with pytest.raises(extend_kernels.NativeRefused):  # heads not packed in K's rows
        flash_attention.causal_attention(q, k.transpose(0, 1).contiguous().transpose(0, 1), v, 0.125)
    with pytest.raises(extend_kernels.NativeRefused):  # a head size off the 8-float tiles
        flash_attention.causal_attention(q[..., :60], k[..., :60], v[..., :60], 0.125)


@pytest.mark.parametrize("prefixes", [(0,), (0, 0), (21, 0), (5, 300)])
def test_paged_attention_extend_native_matches_sdpa(prefixes: tuple[int, ...], monkeypatch: pytest.MonkeyPatch):
    """Sequences packed in one extend, each over its cached prefix (scattered pool slots) and its new rows."""
    heads, kv_heads, dim, new = 4, 2, 64, 19
    gen = torch.Generator().manual_seed(2)
    pool = 1024
    k_cache, v_cache = torch.randn(pool, kv_heads, dim, generator=gen), torch.randn(pool, kv_heads, dim, generator=gen)
    slots = torch.randperm(pool, generator=gen)
    seq_kv, out_locs, taken = [], [], 0
    for prefix in prefixes:
        seq_kv.append(slots[taken : taken + prefix + new])
        out_locs.append(seq_kv[-1][prefix:])
        taken += prefix + new
    spans = [(i * new, new) for i in range(len(prefixes))]
    masks = [
        None if p == 0 else torch.arange(p + new)[None, :] <= torch.arange(new)[:, None] + p for p in prefixes
    ]  # fmt: skip
    tokens = new * len(prefixes)
    qg = torch.randn(tokens, heads, 2 * dim, generator=gen)
    q, gate = qg[..., :dim], qg[..., dim:]
    k, v = torch.randn(tokens, kv_heads, dim, generator=gen), torch.randn(tokens, kv_heads, dim, generator=gen)

    def run() -> torch.Tensor:
        meta = AttentionMetadata(decode=False, seq_kv=seq_kv, q_spans=spans, seq_masks=masks)
        return paged_attention(q, k, v, k_cache.clone(), v_cache.clone(), torch.cat(out_locs), meta, dim**-0.5, gate)

    native = run()
    monkeypatch.setattr(flash_attention, "causal_attention", _refuse)
    torch.testing.assert_close(native, run(), rtol=1e-5, atol=2e-6)


def _refuse(*args: object, **kwargs: object) -> torch.Tensor:
    raise extend_kernels.NativeRefused("the SDPA path, for comparison")


@pytest.mark.parametrize(("heads", "dim", "rotary"), [(4, 64, 16), (2, 128, 128), (3, 256, 64), (2, 64, 0)])
def test_norm_rope_matches_torch(heads: int, dim: int, rotary: int):
    """The q/k prologue against the torch path it replaces: F.rms_norm, then RotaryEmbedding.rotate."""
    tokens = 77
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, heads, 2 * dim, generator=gen)[..., :dim]  # q as a view of q_proj's [query | gate]
    weight = 1.0 + 0.1 * torch.randn(dim, generator=gen)
    positions = torch.arange(500, 500 + tokens)
    cos_sin = RotaryEmbedding(dim, rotary, 10000.0).cos_sin(positions, torch.float32) if rotary else None
    expected = F.rms_norm(x, (dim,), weight, 1e-6)
    if cos_sin is not None:
        expected = RotaryEmbedding.rotate(expected, *cos_sin)
    got = flash_attention.norm_rope(x, weight, 1e-6, cos_sin)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(extend_kernels.NativeRefused):  # tables for other tokens
        flash_attention.norm_rope(x[1:], weight, 1e-6, cos_sin or (torch.ones(1),) * 2)
