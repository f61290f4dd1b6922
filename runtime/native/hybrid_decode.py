"""A hybrid LM's decode step in C (hybrid_decode.c), called through ctypes: tensors and pointers only.

`DecodeWeights` (decode_weights.py) names every tensor the C side reads (the model's own parameter storage, plus a
few parameter-only derived tensors); `HybridDecodeKernel` checks each one (CPU, contiguous, the shape the C code
assumes; weight matrices fp32 or bf16, read in place in either; small vectors fp32) once, lays out the C structs
(decode_structs.py) once, and per step fills only the step's fields. A wrong pointer would be a segfault
that kills the server, so everything the C code dereferences is checked here first; the C code itself checks
only that the indices it is given lie inside the pools.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Sequence
from pathlib import Path

import torch

from runtime.native.build import NativeLibrary, NativeUnavailable, load
from runtime.native.decode_structs import (
    WEIGHT_DTYPES,
    FloatPtr,
    FloatPtrTable,
    HDLayer,
    HDMat,
    HDModel,
    HDStep,
    IndexPtr,
)
from runtime.native.decode_weights import (
    ATTENTION_KIND,
    KDA_KIND,
    LINEAR_KIND,
    MAMBA2_KIND,
    MLA_KIND,
    NO_MIXER_KIND,
    PARALLEL_KIND,
    DecodeWeights,
    DeltaNetWeights,
    LayerWeights,
)
from runtime.native.ffn_weights import fill_ffn
from runtime.native.kda_weights import KDAWeights, fill_kda
from runtime.native.mamba2_weights import Mamba2Weights, fill_mamba2
from runtime.native.mla_weights import MLAWeights, fill_mla
from runtime.native.parallel_weights import ParallelWeights, each_mixer, fill_parallel

SOURCE = Path(__file__).with_name("hybrid_decode.c")
_ERRORS = {
    1: "a token id outside the vocabulary",
    2: "a KV token slot outside the KV pool",
    3: "a state slot outside the state pool",
    4: "out of memory for the step's scratch",
    5: "a sequence with no KV tokens",
    6: "a state checkpoint outside the extend or the state pool",
    7: "an extend over a Kimi-Linear layer (the C step runs its decode rows only)",
}


def load_library(name: str = "hybrid_decode", source: Path = SOURCE) -> NativeLibrary:
    """The kernel compiled from `source` (first use, then cached), loaded once a `name`; else NativeUnavailable."""
    library = load(name, source)
    fn = library.lib.hd_decode
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(HDModel), ctypes.POINTER(HDStep)]
    library.lib.hd_set_threads.argtypes = [ctypes.c_int]
    library.lib.hd_set_threads.restype = None
    library.lib.hd_threads.restype = ctypes.c_int
    library.lib.hd_set_min_part_bytes.argtypes = [ctypes.c_int64]
    library.lib.hd_set_min_part_bytes.restype = None
    return library


def set_threads(library: NativeLibrary, threads: int) -> None:
    """The threads every later step of this library splits its work over (parallel.h's pool, one per library:
    1 runs on the calling thread alone and starts no worker). Results are bit-identical under any count."""
    if threads < 1:
        raise ValueError(f"native decode: thread count must be >= 1, got {threads}")
    library.lib.hd_set_threads(int(threads))


def threads(library: NativeLibrary) -> int:
    return int(library.lib.hd_threads())


def set_min_part_bytes(library: NativeLibrary, nbytes: int) -> None:
    """The least weight bytes a thread's part of a projection streams (default 32 KiB: a smaller part costs more
    in the region than it saves); tests set 1 to split even a tiny model's projections down to 4-row blocks."""
    library.lib.hd_set_min_part_bytes(int(nbytes))


class WeightError(ValueError):
    """A tensor the C code would read is not what it assumes (the reason names the tensor)."""


class HybridDecodeKernel:
    def __init__(self, weights: DecodeWeights, library: NativeLibrary | None = None) -> None:
        self.library = library or load_library()
        self.weights = weights
        self._kept: list[torch.Tensor] = []
        h = weights.hidden
        layers = (HDLayer * len(weights.layers))()
        for i, lw in enumerate(weights.layers):
            self._fill_layer(layers[i], lw, h, f"layer {i}")
        self._layers = layers
        self._model = HDModel(
            hidden=h,
            vocab=weights.vocab,
            n_layers=len(weights.layers),
            eps=weights.eps,
            embed_scale=weights.embed_scale,
            residual_scale=weights.residual_scale,
            logits_div=weights.logits_div,
            logits_mul=weights.logits_mul,
            embed=self._mat(weights.embed, (weights.vocab, h), "embed"),
            final_norm=self._ptr(weights.final_norm, (h,), "final norm"),
            lm_head=self._mat(weights.lm_head, (weights.vocab, h), "lm_head"),
            layers=ctypes.cast(layers, ctypes.POINTER(HDLayer)),
        )
        self._fn = self.library.lib.hd_decode
        self._model_ref = ctypes.byref(self._model)
        # The step's struct, kept: per step only its index pointers and batch size change (bind_pools sets the rest).
        self._step = HDStep()
        self._step_ref = ctypes.byref(self._step)
        self._bound = False
        self._pools: tuple[list[torch.Tensor], ...] = ()
        self._tables: list[ctypes.Array[ctypes._Pointer[ctypes.c_float]]] = []

    def _ptr(self, t: torch.Tensor | None, shape: tuple[int, ...], name: str) -> ctypes._Pointer[ctypes.c_float] | None:
        """A small fp32 vector (a norm, a bias, the conv taps): a bf16 one is widened into a kept fp32 copy
        (kilobytes), so the step's elementwise arithmetic stays fp32 whatever the weights' dtype."""
        if t is None:
            return None
        if t.dtype == torch.bfloat16:
            t = t.float()
        self._check(t, shape, name, (torch.float32,))
        self._kept.append(t)
        return ctypes.cast(t.data_ptr(), FloatPtr)

    def _mat(self, t: torch.Tensor | None, shape: tuple[int, ...], name: str) -> HDMat:
        """A weight matrix, read in place in its own dtype (fp32 or bf16: no copy); an absent one has NULL data."""
        if t is None:
            return HDMat(None, 0)
        self._check(t, shape, name, tuple(WEIGHT_DTYPES))
        self._kept.append(t)
        return HDMat(t.data_ptr(), WEIGHT_DTYPES[t.dtype])

    @staticmethod
    def _check(t: torch.Tensor, shape: tuple[int, ...], name: str, dtypes: tuple[torch.dtype, ...]) -> None:
        if t.dtype not in dtypes or t.device.type != "cpu" or not t.is_contiguous() or tuple(t.shape) != shape:
            wanted = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise WeightError(
                f"{name}: need a contiguous {wanted} CPU tensor of shape {list(shape)}, got {t.dtype} "
                f"{list(t.shape)} on {t.device} (contiguous: {t.is_contiguous()})"
            )

    def _fill_layer(self, c: HDLayer, lw: LayerWeights, h: int, name: str) -> None:
        c.kind, c.ordinal = lw.kind, lw.ordinal
        if (lw.mixer is None) != (lw.kind == NO_MIXER_KIND) or (lw.mixer is None) != (lw.in_norm is None):
            raise WeightError(f"{name}: a mixer needs an input norm and a mixer kind, and only a mixer has them")
        if (lw.ffn is None) != (lw.post_norm is None):
            raise WeightError(f"{name}: a feed-forward needs its input norm, and only a feed-forward has one")
        c.in_norm = self._ptr(lw.in_norm, (h,), f"{name} input norm")
        c.post_norm = self._ptr(lw.post_norm, (h,), f"{name} post-attention norm")
        m = lw.mixer
        attention_kind = ATTENTION_KIND
        if isinstance(m, ParallelWeights):  # Falcon-H1: the Mamba2 half and multipliers here, attention below
            if lw.kind != PARALLEL_KIND:
                raise WeightError(f"{name}: a parallel mixer on a layer of kind {lw.kind}")
            try:
                fill_parallel(c, m, h, name, self._mat, self._ptr)
            except ValueError as exc:
                raise WeightError(str(exc)) from exc
            m, attention_kind = m.attention, PARALLEL_KIND
        if isinstance(m, Mamba2Weights):
            if lw.kind != MAMBA2_KIND:
                raise WeightError(f"{name}: a Mamba2 mixer on a layer of kind {lw.kind}")
            try:
                fill_mamba2(c, m, h, name, self._mat, self._ptr)
            except ValueError as exc:
                raise WeightError(str(exc)) from exc
        elif isinstance(m, KDAWeights | MLAWeights):
            if lw.kind != (KDA_KIND if isinstance(m, KDAWeights) else MLA_KIND):
                raise WeightError(f"{name}: a {type(m).__name__[:3]} mixer on a layer of kind {lw.kind}")
            try:
                fill = fill_kda if isinstance(m, KDAWeights) else fill_mla
                fill(c, m, h, name, self._mat, self._ptr)  # type: ignore[arg-type]
            except ValueError as exc:
                raise WeightError(str(exc)) from exc
        elif isinstance(m, DeltaNetWeights):
            if lw.kind != LINEAR_KIND or m.num_v_heads % m.num_k_heads:
                raise WeightError(f"{name}: a DeltaNet mixer on a non-linear layer, or v heads not a multiple of k")
            key, value = m.num_k_heads * m.k_head_dim, m.num_v_heads * m.v_head_dim
            conv_dim = 2 * key + value
            c.nk, c.nv, c.dk, c.dv, c.kernel = m.num_k_heads, m.num_v_heads, m.k_head_dim, m.v_head_dim, m.kernel
            c.w_qkv = self._mat(m.qkv, (conv_dim, h), f"{name} qkv projection")
            c.w_z = self._mat(m.z, (value, h), f"{name} z projection")
            c.w_b = self._mat(m.b, (m.num_v_heads, h), f"{name} b projection")
            c.w_a = self._mat(m.a, (m.num_v_heads, h), f"{name} a projection")
            c.conv_w = self._ptr(m.conv, (conv_dim, m.kernel), f"{name} conv weight")
            c.conv_b = self._ptr(m.conv_bias, (conv_dim,), f"{name} conv bias")
            c.neg_a = self._ptr(m.neg_a, (m.num_v_heads,), f"{name} decay rate")
            c.dt_bias = self._ptr(m.dt_bias, (m.num_v_heads,), f"{name} dt_bias")
            c.gnorm_w = self._ptr(m.norm, (m.v_head_dim,), f"{name} gated norm")
            c.w_out = self._mat(m.out, (h, value), f"{name} out projection")
        elif m is not None:
            if lw.kind != attention_kind or m.heads % m.kv_heads or m.rotary_dim % 2 or m.rotary_dim > m.head_dim:
                raise WeightError(f"{name}: attention heads/rotary dims the kernel does not handle")
            qw = m.heads * m.head_dim * (2 if m.output_gate else 1)
            kvw = m.kv_heads * m.head_dim
            c.nh, c.nkv, c.hd, c.rot_dim, c.out_gate = m.heads, m.kv_heads, m.head_dim, m.rotary_dim, m.output_gate
            c.attn_scale = m.scale
            c.wq = self._mat(m.q, (qw, h), f"{name} q_proj")
            c.wk = self._mat(m.k, (kvw, h), f"{name} k_proj")
            c.wv = self._mat(m.v, (kvw, h), f"{name} v_proj")
            c.wo = self._mat(m.o, (h, m.heads * m.head_dim), f"{name} o_proj")
            if m.biases is not None:
                bq, bk, bv, bo = m.biases
                c.bq = self._ptr(bq, (qw,), f"{name} q bias")
                c.bk = self._ptr(bk, (kvw,), f"{name} k bias")
                c.bv = self._ptr(bv, (kvw,), f"{name} v bias")
                c.bo = self._ptr(bo, (h,), f"{name} o bias")
            c.q_norm = self._ptr(m.q_norm, (m.head_dim,), f"{name} q norm")
            c.k_norm = self._ptr(m.k_norm, (m.head_dim,), f"{name} k norm")
            c.inv_freq = self._ptr(m.inv_freq, (m.rotary_dim // 2,), f"{name} inv_freq")
        f = lw.ffn
        if f is None:
            if m is None:
                raise WeightError(f"{name}: neither a mixer nor a feed-forward")
            return
        try:
            fill_ffn(c, f, h, name, self._mat, self._ptr)
        except ValueError as exc:
            raise WeightError(str(exc)) from exc

    def pools_error(
        self, k: list[torch.Tensor], v: list[torch.Tensor], conv: list[torch.Tensor], ssm: list[torch.Tensor]
    ) -> str | None:
        """Why the pool buffers cannot be handed to the kernel (None: they can): counts, dtypes, shapes."""
        w = self.weights
        if len(k) < w.attention_layers or len(v) < w.attention_layers or len(conv) < w.linear_layers:
            return "fewer pool buffers than layers"
        if len(ssm) < w.linear_layers:
            return "fewer state buffers than linear layers"
        for name, group in (("k", k), ("v", v), ("conv", conv), ("ssm", ssm)):
            for t in group:
                if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
                    return f"the {name} pool is not a contiguous fp32 CPU tensor ({t.dtype}, {t.device})"
        for lw in each_mixer(w.layers):
            m = lw.mixer
            if isinstance(m, Mamba2Weights | KDAWeights):
                want_c, want_m = m.pool_shapes()
                if tuple(conv[lw.ordinal].shape[1:]) != want_c or tuple(ssm[lw.ordinal].shape[1:]) != want_m:
                    kind = "Mamba2" if isinstance(m, Mamba2Weights) else "KDA"
                    return f"state buffers of {kind} layer {lw.ordinal} are not {list(want_c)} / {list(want_m)}"
            elif isinstance(m, MLAWeights):
                want_k, want_v = m.pool_shapes()
                if tuple(k[lw.ordinal].shape[1:]) != want_k or tuple(v[lw.ordinal].shape[1:]) != want_v:
                    return f"KV buffers of MLA layer {lw.ordinal} are not {list(want_k)} / {list(want_v)}"
            elif isinstance(m, DeltaNetWeights):
                conv_dim = 2 * m.num_k_heads * m.k_head_dim + m.num_v_heads * m.v_head_dim
                want_c = (conv_dim, m.kernel - 1)
                want_s = (m.num_v_heads, m.v_head_dim, m.k_head_dim)
                if tuple(conv[lw.ordinal].shape[1:]) != want_c or tuple(ssm[lw.ordinal].shape[1:]) != want_s:
                    return f"state buffers of linear layer {lw.ordinal} are not {list(want_c)} / {list(want_s)}"
            elif m is not None and not isinstance(m, ParallelWeights):  # each_mixer split those
                want = (m.kv_heads, m.head_dim)
                if tuple(k[lw.ordinal].shape[1:]) != want or tuple(v[lw.ordinal].shape[1:]) != want:
                    return f"KV buffers of attention layer {lw.ordinal} are not [slots, {want[0]}, {want[1]}]"
        return None

    def bind_pools(
        self, k: list[torch.Tensor], v: list[torch.Tensor], conv: list[torch.Tensor], ssm: list[torch.Tensor]
    ) -> None:
        """Point the step at these pool buffers (checked by `pools_error` first: ValueError with the reason).
        Call again whenever a buffer is replaced; the tables stay valid until then."""
        if reason := self.pools_error(k, v, conv, ssm):
            raise ValueError(f"native decode: {reason}")

        def table(group: list[torch.Tensor]) -> ctypes.Array[ctypes._Pointer[ctypes.c_float]]:
            return (FloatPtr * max(len(group), 1))(*(ctypes.cast(t.data_ptr(), FloatPtr) for t in group))

        self._pools = (list(k), list(v), list(conv), list(ssm))  # the buffers stay alive while pointed at
        self._tables = [table(group) for group in (k, v, conv, ssm)]
        step = self._step
        step.k_pool, step.v_pool, step.conv_pool, step.ssm_pool = (ctypes.cast(t, FloatPtrTable) for t in self._tables)
        # No KV pools (a model of recurrent layers only): no token slot is ever dereferenced, any index will do.
        step.token_slots = min((t.shape[0] for t in (*k, *v)), default=2**62)
        step.state_slots_count = min((t.shape[0] for t in (*conv, *ssm)), default=0)
        self._bound = True

    def step(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        out_locs: torch.Tensor,
        state_slots: torch.Tensor,
        kv_offsets: torch.Tensor,
        kv_flat: torch.Tensor,
    ) -> torch.Tensor:
        """Logits [B, vocab] fp32 for one new token per sequence; writes K/V at `out_locs` and advances every
        linear layer's state at `state_slots`, in the pools of the last `bind_pools`. Index tensors: int64, CPU,
        contiguous, [B] (`kv_offsets` [B+1], from 0 to kv_flat's length: sequence b's KV slots are
        kv_flat[kv_offsets[b]:kv_offsets[b+1]])."""
        batch = ids.shape[0]
        _check_index(state_slots, batch, "state_slots")
        _check_index(kv_offsets, batch + 1, "kv_offsets")
        # Distinct rows: the threads advance each sequence's state (and write its K/V) in parallel, so a shared
        # slot would be a data race in C, not just a wrong answer.
        if batch > 1 and (len(set(state_slots.tolist())) != batch or len(set(out_locs.tolist())) != batch):
            raise ValueError("native decode: two sequences of the step share a state slot or a KV slot")
        offsets = kv_offsets.tolist()
        if offsets[0] != 0 or offsets[-1] != kv_flat.numel() or any(b < a for a, b in itertools.pairwise(offsets)):
            raise ValueError("native decode: kv_offsets must rise from 0 to the number of KV slots")
        return self._call(ids, positions, out_locs, state_slots, kv_offsets, kv_flat, chain=False, fresh=False)

    def extend(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        out_locs: torch.Tensor,
        state_slot: int,
        kv_flat: torch.Tensor,
        checkpoints: Sequence[tuple[int, int]] = (),
        *,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Logits [1, vocab] fp32 of the last of ONE sequence's T new tokens ([T, vocab], every token's, with
        `all_logits`: a speculative verify) (`ids`, `positions`, `out_locs`: [T]),
        after the cached tokens whose KV slots begin `kv_flat` (all its tokens' slots, the new ones last: they must
        be `out_locs`). Writes the new K/V and advances the conv window and state at `state_slot` token by token;
        with no cached token the state starts from zero whatever the slot holds. `checkpoints`: (n, slot) pairs,
        the conv window and state after the first n new tokens also copied to `slot` (ForwardBatch's
        state_checkpoints of this sequence)."""
        tokens = ids.shape[0]
        _check_index(kv_flat, kv_flat.numel(), "kv_flat")
        prefix = kv_flat.numel() - tokens
        if tokens < 1 or prefix < 0:
            raise ValueError("native decode: an extend needs at least one new token, each with a KV slot")
        _check_index(out_locs, tokens, "out_locs")
        # The rows' K/V are written at out_locs and read back through kv_flat: the two must name the same slots,
        # and distinct ones (each row its own).
        if not torch.equal(kv_flat[prefix:], out_locs) or len(set(out_locs.tolist())) != tokens:
            raise ValueError("native decode: an extend's new KV slots must be distinct and end kv_flat")
        # Row t attends to kv_flat[0 : prefix + t + 1] (HDStep.chain).
        offsets = torch.arange(prefix, prefix + tokens + 1, dtype=torch.int64)
        offsets[0] = 0
        slots = torch.full((tokens,), int(state_slot), dtype=torch.int64)
        marks = None
        if checkpoints:
            ns, dsts = [int(n) for n, _ in checkpoints], [int(d) for _, d in checkpoints]
            # Distinct destinations, none the sequence's own slot: two units copying into one slot would race.
            if not all(0 < n <= tokens for n in ns) or len(set(dsts)) != len(dsts) or int(state_slot) in dsts:
                raise ValueError(
                    f"native decode: state checkpoints {list(checkpoints)} must take 1..{tokens} tokens into "
                    f"distinct slots other than the sequence's own ({state_slot})"
                )
            marks = (torch.tensor(ns, dtype=torch.int64), torch.tensor(dsts, dtype=torch.int64))
        return self._call(
            ids,
            positions,
            out_locs,
            slots,
            offsets,
            kv_flat,
            chain=True,
            fresh=prefix == 0,
            checkpoints=marks,
            last_only=not all_logits,
        )

    def _call(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        out_locs: torch.Tensor,
        state_slots: torch.Tensor,
        kv_offsets: torch.Tensor,
        kv_flat: torch.Tensor,
        *,
        chain: bool,
        fresh: bool,
        checkpoints: tuple[torch.Tensor, torch.Tensor] | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        if not self._bound:
            raise ValueError("native decode: no pools bound (bind_pools)")
        batch = ids.shape[0]
        for t, name in ((ids, "ids"), (positions, "positions"), (out_locs, "out_locs")):
            _check_index(t, batch, name)
        _check_index(kv_flat, kv_flat.numel(), "kv_flat")
        last_only = chain and last_only
        logits = torch.empty(1 if last_only else batch, self.weights.vocab, dtype=torch.float32)
        step = self._step
        step.batch = batch
        step.ids = ctypes.cast(ids.data_ptr(), IndexPtr)
        step.positions = ctypes.cast(positions.data_ptr(), IndexPtr)
        step.out_locs = ctypes.cast(out_locs.data_ptr(), IndexPtr)
        step.state_slots = ctypes.cast(state_slots.data_ptr(), IndexPtr)
        step.kv_offsets = ctypes.cast(kv_offsets.data_ptr(), IndexPtr)
        step.kv_flat = ctypes.cast(kv_flat.data_ptr(), IndexPtr)
        step.logits = ctypes.cast(logits.data_ptr(), FloatPtr)
        step.chain, step.fresh, step.last_logits = int(chain), int(fresh), int(last_only)
        step.n_checkpoints = 0 if checkpoints is None else checkpoints[0].numel()
        if checkpoints is not None:  # the tensors live until the call returns (this frame holds them)
            step.checkpoint_tokens = ctypes.cast(checkpoints[0].data_ptr(), IndexPtr)
            step.checkpoint_slots = ctypes.cast(checkpoints[1].data_ptr(), IndexPtr)
        code = self._fn(self._model_ref, self._step_ref)
        if code != 0:
            raise ValueError(f"native decode refused the step: {_ERRORS.get(code, f'error {code}')}")
        return logits


def _check_index(t: torch.Tensor, n: int, name: str) -> None:
    """`t` must be what the C side reads through its pointer: a contiguous int64 CPU tensor of `n` values."""
    if t.dtype != torch.int64 or t.device.type != "cpu" or not t.is_contiguous() or t.shape != (n,):
        raise ValueError(f"native decode: {name} must be a contiguous int64 CPU tensor of {n} values")


__all__ = [
    "HybridDecodeKernel",
    "Mamba2Weights",
    "NativeUnavailable",
    "WeightError",
    "load_library",
    "set_min_part_bytes",
    "set_threads",
    "threads",
]
