"""Native decode (`--native-decode`, on by default where it applies): a decode step as ONE C call
(runtime/native/hybrid_decode.c) instead of ~800 dispatched torch ops.

This module decides which models and batches go native and builds the kernel's weight table from the model's
own parameters (no copies; the few parameter-only derived tensors, `1 + w` and `-exp(A_log)`, come from the
layers' kept caches and the table is rebuilt when one of their source parameters changes). The runner calls it
for decode batches, one-token continuations and short single-sequence extends (2..EXTEND_MAX_TOKENS new tokens of
one sequence as rows of one chain, the recurrent state advanced token by token; RUNTIME_NATIVE_EXTEND=0 leaves
them to the torch path), before the compiled paths: where both are on, native wins the decode step and the short
extends (it needs no warm-up).

Applies to: Qwen3NextForCausalLM (qwen3_next, qwen3_5, qwen3_5_moe), NemotronHForCausalLM (MoE blocks without
latent projections; runtime/engine/native_nemotron.py), GraniteHybridForCausalLM (runtime/engine/
native_granite.py), KimiLinearForCausalLM (runtime/engine/native_kimi.py) and FalconH1ForCausalLM
(runtime/engine/native_falcon.py; the Kimi-Linear family decodes rows only, its extends stay torch's) on CPU with
fp32 or bf16 weights (each weight matrix read in place in its own dtype; bf16 widened to fp32 in registers, so the
step computes exactly what it computes on fp32 weights rounded to bf16) and fp32 pools; elsewhere the status says
why and the torch path runs.

Threads: the C step splits its weight rows over a pool of its own (runtime/native/parallel.h) of as many threads as
the process's torch thread count (`--num-threads`) and the cores it may run on allow; RUNTIME_NATIVE_DECODE_THREADS
sets another count. Fixed, not chosen per step as the torch paths' counts are: the pool's parts are claimed one at
a time, so a worker that is descheduled on a busy host costs at most the part it holds (the caller runs the rest),
and served A/Bs on the shared 2-core host (docs/performance.md, "Runtime hot path") had two
fixed threads at or ahead of both one thread and a per-step DecodeThreadChooser at every load tried, while the
chooser flapped on the step's noise. The result does not depend on the count (bit-identical rows;
tests/runtime/test_native_decode_threads.py).
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass

import torch
from torch import nn

from runtime.core.batch import ForwardBatch, PoolBuffers
from runtime.engine.native_weights import Unsupported
from runtime.models.base import HybridModel
from runtime.models.decoder import DecoderLM
from runtime.models.kimi_linear import KimiDeltaAttention, KimiMLA
from runtime.models.layers.gated_deltanet import GatedDeltaNet
from runtime.models.layers.mamba2 import Mamba2Mixer
from runtime.models.layers.norm import GroupedGatedRMSNorm, RMSNorm, ZeroCenteredRMSNorm
from runtime.native.amx import bf16_tiles
from runtime.native.build import NativeUnavailable
from runtime.native.decode_structs import WEIGHT_DTYPES
from runtime.native.decode_weights import MAMBA2_KIND, PARALLEL_KIND, DecodeWeights
from runtime.native.hybrid_decode import (
    HybridDecodeKernel,
    WeightError,
    load_library,
    set_threads,
    threads,
)
from runtime.native.threads import pinned_from_env, usable_threads

logger = logging.getLogger("runtime.engine")

MODES = ("auto", "on", "off")
THREADS_ENV = "RUNTIME_NATIVE_DECODE_THREADS"  # pins the native step's thread count ("1", "2", ...)
# The longest single-sequence extend the C step takes as one chain of rows (a warm request's new tokens after a
# cached prefix, a multi-turn follow-up, a short prompt). Measured on the peer model (docs/performance.md, "Runtime
# hot path"): 1.5-2.2x torch's extend at 48-512 new tokens after 2000 cached ones,
# 1.8-1.9x for fresh prompts of 128-512. It wins past 512 too (1.3x at 1024 after 2000, up to 1.7x for a fresh
# 2048); those stay torch prefills until a chain that long is checked against transformers (the docs say why).
EXTEND_MAX_TOKENS = 512
# The longest chain of a model with Mamba2 layers (Nemotron-H, Granite-4.0-H, Falcon-H1), by weight dtype: their
# dense layers make an extend's projections compute-bound sooner. Real Nemotron-H bf16 on an AMX host (the
# projections on amx_gemm.h's tiles at every batch size), 2 threads with a second job on the host, after 300 cached
# tokens, wall ms, median of 3 (chain and torch extend interleaved in one process): 4 tokens 141 vs 293, 8 151 vs
# 304, 16 172 vs 333, 32 210 vs 400, 48 258 vs 537, 64 370 vs 564, 96 561 vs 669, 128 845 vs 713 (torch wins
# from ~100). A host without AMX runs bf16 projections past 11 rows on FMAs, slower than torch from ~12 rows (16
# 589 vs 473, 48 1391 vs 701 ms process CPU): MAMBA2_EXTEND_MAX_TOKENS_FMA there. fp32 (FMA; process CPU): 8 375
# vs 886, 16 605 vs 976, 32 994 vs 1178. A speculative verify (steps + 1 tokens) stays well inside.
MAMBA2_EXTEND_MAX_TOKENS = {torch.bfloat16: 64, torch.float32: 32}
MAMBA2_EXTEND_MAX_TOKENS_FMA = {torch.bfloat16: 8, torch.float32: 32}  # bf16 weights without AMX tiles
# "0": leave those extends to the torch path. On by default: its attention (query rows as
# vector lanes) and GEMMs made the warm request's 48-token extend ~1.5x faster than torch's GEMMs and SDPA around
# the short-extend kernels (docs/performance.md, "Runtime hot path").
EXTEND_ENV = "RUNTIME_NATIVE_EXTEND"


def extends_from_env() -> bool:
    """Whether the native step takes short extends: RUNTIME_NATIVE_EXTEND unset or "1" yes, "0" no; ValueError
    naming the variable for anything else."""
    raw = os.environ.get(EXTEND_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(
            f"{EXTEND_ENV}={raw!r}: expected 1 (native short extends, the default) or 0 (torch), or unset it"
        )
    return raw != "0"


def native_reads(weight_dtype: torch.dtype) -> bool:
    """THE dtype gate of the native path: whether the C step reads weights held in `weight_dtype`
    (`HybridModel.weight_dtype`; `WEIGHT_DTYPES`, fp32 and bf16). A model held in any other dtype decodes on the
    torch path."""
    return weight_dtype in WEIGHT_DTYPES


def _version(t: torch.Tensor) -> int:
    return 0 if t.is_inference() else t._version  # noqa: SLF001 - torch has no public accessor for it


def decode_weights(model: HybridModel) -> DecodeWeights:
    """The kernel's view of `model`'s tensors; Unsupported naming the first thing the kernel does not compute."""
    from runtime.models.falcon_h1 import FalconH1ForCausalLM
    from runtime.models.granite_hybrid import GraniteHybridForCausalLM
    from runtime.models.kimi_linear import KimiLinearForCausalLM
    from runtime.models.nemotron_h import NemotronHForCausalLM
    from runtime.models.qwen3_next import Qwen3NextDecoderLayer, Qwen3NextForCausalLM

    families = (
        Qwen3NextForCausalLM,
        NemotronHForCausalLM,
        GraniteHybridForCausalLM,
        KimiLinearForCausalLM,
        FalconH1ForCausalLM,
    )
    if not isinstance(model, families) or type(model) not in families:  # exact classes: a subclass may differ
        raise Unsupported(
            f"{type(model).__name__} is not a Qwen3-Next-, Nemotron-H-, Granite-4.0-H-, Kimi-Linear- or "
            "Falcon-H1-family model"
        )
    # Granite's own scale_logits (a division by logits_scaling) is the C step's logits_div, Falcon-H1's (a product
    # by lm_head_multiplier) its logits_mul.
    scales = (DecoderLM.scale_logits, GraniteHybridForCausalLM.scale_logits, FalconH1ForCausalLM.scale_logits)
    if type(model).scale_logits not in scales:
        raise Unsupported(f"{type(model).__name__} scales its logits")
    _check_hooks_and_storage(model)
    if isinstance(model, NemotronHForCausalLM):
        from runtime.engine.native_nemotron import nemotron_h_weights

        return nemotron_h_weights(model)
    if isinstance(model, GraniteHybridForCausalLM):
        from runtime.engine.native_granite import granite_hybrid_weights

        return granite_hybrid_weights(model)
    if isinstance(model, KimiLinearForCausalLM):
        from runtime.engine.native_kimi import kimi_linear_weights

        return kimi_linear_weights(model)
    if isinstance(model, FalconH1ForCausalLM):
        from runtime.engine.native_falcon import falcon_h1_weights

        return falcon_h1_weights(model)
    if not isinstance(model, Qwen3NextForCausalLM):  # unreachable: the families above are exhaustive
        raise Unsupported(f"{type(model).__name__} has no weight table")
    from runtime.engine.native_qwen3_next import qwen3_next_weights

    return qwen3_next_weights(model, Qwen3NextDecoderLayer)


def _check_hooks_and_storage(model: HybridModel) -> None:
    """Unsupported when a forward hook needs the torch forward, or the weights are not host fp32 / bf16."""
    hooked = _hooked_module(model)
    if hooked:
        # E.g. the MTP drafter's capture of the last layer's output (runtime/speculative/mtp.py): the C step
        # runs no hook.
        raise Unsupported(f"a forward hook on {hooked} needs the torch forward (speculative decoding's capture)")
    params = list(model.parameters())
    if any(p.device.type != "cpu" for p in params):
        raise Unsupported("the model is not on the CPU")
    odd = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.dtype not in WEIGHT_DTYPES})
    if odd:
        raise Unsupported(f"the weights are {', '.join(odd)}: the native step reads fp32 or bf16")


def _hooked_module(model: nn.Module) -> str:
    """The name of a module with a forward hook ("" when none; "model" for the model itself)."""
    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks:  # noqa: SLF001 - torch has no public accessor
            return name or "model"
    return ""


@dataclass(frozen=True)
class NativeStatus:
    """What the start-up log and /server_info say: `state` "on" / "off", and the detail (why off; compiled or
    cached; the thread setting)."""

    state: str
    detail: str

    def line(self) -> str:
        return f"Native decode: {self.state} ({self.detail})"


class NativeDecode:
    """The runner's native decode path for one model; `handles(batch)` says which batches it takes."""

    def __init__(self, model: HybridModel, *, extends: bool | None = None) -> None:
        self.model = model
        # Short single-sequence extends as one chain of rows (`extends`; default: extends_from_env()).
        self.extends = extends_from_env() if extends is None else extends
        self.library = load_library()  # NativeUnavailable: no compiler, a compile error, HYBRIDCTL_NATIVE=0
        pinned = pinned_from_env(THREADS_ENV)
        self.pinned = pinned is not None
        set_threads(self.library, pinned if pinned is not None else usable_threads())
        # What the pool took (it caps the count): what the log reports. Benchmarks and tests set None to set the
        # library's count themselves.
        self.threads: int | None = threads(self.library)
        self._sources = _derived_sources(model)
        self._key: tuple[tuple[int, int], ...] | None = None
        self.kernel = self._rebuild()
        # A model the C step runs decode rows of only (KDA and MLA layers): its extends stay torch's.
        self.extends_model = self.kernel.weights.extends
        self.extends = self.extends and self.extends_model
        # The longest extend taken as one chain (see MAMBA2_EXTEND_MAX_TOKENS).
        self.chain_max_tokens = EXTEND_MAX_TOKENS
        if any(lw.kind in (MAMBA2_KIND, PARALLEL_KIND) for lw in self.kernel.weights.layers):
            limits = MAMBA2_EXTEND_MAX_TOKENS if bf16_tiles() else MAMBA2_EXTEND_MAX_TOKENS_FMA
            self.chain_max_tokens = limits.get(model.weight_dtype, 8)
        self._pool_key: tuple[int, ...] | None = None
        self.steps = 0
        self.verifies = 0  # of the steps, the speculative verify chains (every row's logits)

    def _rebuild(self) -> HybridDecodeKernel:
        try:
            kernel = HybridDecodeKernel(decode_weights(self.model), self.library)
        except WeightError as exc:
            raise Unsupported(str(exc)) from exc
        self._key = self._source_key()
        return kernel

    def _source_key(self) -> tuple[tuple[int, int], ...]:
        return tuple((p.data_ptr(), _version(p)) for p in self._sources)

    def handles(self, batch: ForwardBatch) -> bool:
        if self.extends and _short_extend(batch, self.chain_max_tokens):
            # Its state checkpoints too (the chain copies the state after their tokens). Every row's logits only
            # with checkpoints: an in-forward speculative verify of one request (runtime/speculative/worker.py);
            # without them a verify's states go to a sandbox that only the torch mixers write to.
            return not batch.all_logits or bool(batch.state_checkpoints)
        if batch.all_logits:
            return False
        if batch.state_checkpoints:
            return False
        if batch.mode == "decode":
            return True
        # One-token continuations (runtime/engine/model_runner.py: one_token_continuations).
        return all(n == 1 for n in batch.extend_lens) and all(p > 0 for p in batch.prefix_lens)

    def __call__(self, batch: ForwardBatch, buffers: PoolBuffers) -> torch.Tensor:
        if self._source_key() != self._key:
            self.kernel = self._rebuild()
            self._pool_key = None
        pools = (buffers.k, buffers.v, buffers.conv, buffers.ssm)
        pool_key = tuple(t.data_ptr() for group in pools for t in group)
        if pool_key != self._pool_key:
            # The elastic pool can replace the buffers: checked and bound again whenever their storage changes.
            self.kernel.bind_pools(*pools)
            self._pool_key = pool_key
        kv_locs = batch.kv_locs
        if self.threads is not None:
            # Set every step (one ctypes call, ~1 us): the library's pool is per process, shared by every instance.
            set_threads(self.library, self.threads)
        self.steps += 1
        if self.extends and _short_extend(batch, self.chain_max_tokens):
            ids, positions, out_locs = _int64(batch.input_ids), _int64(batch.positions), _int64(batch.out_locs)
            slot = int(batch.state_slots[0])
            marks = batch.state_checkpoints[0] if batch.state_checkpoints else ()
            kv = _int64(kv_locs[0])
            self.verifies += batch.all_logits
            return self.kernel.extend(ids, positions, out_locs, slot, kv, marks, all_logits=batch.all_logits)
        lengths = [loc.numel() for loc in kv_locs]
        kv_flat = _int64(kv_locs[0]) if len(kv_locs) == 1 else torch.cat([_int64(loc) for loc in kv_locs])
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
        args = (
            _int64(batch.input_ids),
            _int64(batch.positions),
            _int64(batch.out_locs),
            _int64(batch.state_slots),
            offsets,
            kv_flat,
        )
        return self.kernel.step(*args)

    def describe_threads(self) -> str:
        """The thread count ("2", "1 (RUNTIME_NATIVE_DECODE_THREADS)"): what /server_info and the log report."""
        if self.threads is None:
            return "set by the caller"
        return f"{self.threads} ({THREADS_ENV})" if self.pinned else str(self.threads)


def _short_extend(batch: ForwardBatch, max_tokens: int) -> bool:
    """An extend of ONE sequence by 2..max_tokens tokens (cached prefix or fresh, with or without state
    checkpoints, the last token's logits or every token's): the kernel runs its tokens as rows of one chain
    (HDStep.chain)."""
    return batch.mode == "extend" and len(batch.extend_lens) == 1 and 2 <= batch.extend_lens[0] <= max_tokens


def _int64(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when it is already a contiguous int64 CPU tensor (the engine's case), else a converted copy."""
    if t.dtype == torch.int64 and t.device.type == "cpu" and t.is_contiguous():
        return t
    return t.to("cpu", torch.int64).contiguous()


def _derived_sources(model: HybridModel) -> list[torch.Tensor]:
    """The parameters the kernel's derived tensors come from (zero-centred norm weights, A_log; a bf16 model's
    small vectors, which the kernel reads from fp32 copies) and the embedding (its storage changes only when the
    whole model is re-cast or reloaded)."""
    sources: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, ZeroCenteredRMSNorm | RMSNorm | GroupedGatedRMSNorm):
            sources.append(module.weight)
        elif isinstance(module, GatedDeltaNet):
            sources.append(module.A_log)
        elif isinstance(module, KimiDeltaAttention):  # neg_a and the conv taps (runtime/engine/native_kimi.py)
            sources.extend((module.A_log, module.conv1d.weight))
        elif isinstance(module, KimiMLA):  # kv_b_proj's key rows, transposed
            sources.append(module.kv_b_proj.weight)
        elif isinstance(module, Mamba2Mixer):
            norm = getattr(module.norm, "weight", None)  # Falcon-H1's gated norm too
            small = (module.A_log, module.dt_bias, module.D, module.conv1d.weight, module.conv1d.bias, norm)
            sources.extend(p for p in small if p is not None)
    sources.extend(p for name, p in model.named_parameters() if name.endswith("embed_tokens.weight"))
    return sources


def native_decode_for(model: HybridModel, mode: str, device: str) -> tuple[NativeDecode | None, NativeStatus]:
    """The native decode path for `model` under `--native-decode MODE` ("auto": where supported, "on": the same
    but said loudly when it cannot be, "off"), with the one-line status the start-up log prints."""
    if mode == "off":
        return None, NativeStatus("off", "--native-decode off")
    if device != "cpu":
        return None, NativeStatus("off", f"device {device}: native decode is a CPU kernel")
    try:
        native = NativeDecode(model)
    except Unsupported as exc:
        return None, NativeStatus("off", str(exc))
    except NativeUnavailable as exc:
        return None, NativeStatus("off", exc.reason)
    lib = native.library
    detail = f"compiled in {lib.compile_seconds:.1f} s" if lib.compiled else "cached"
    if native.extends:
        extends = "; short extends"
    elif not native.extends_model:
        extends = "; short extends off (KDA and MLA layers: decode rows only)"
    else:
        extends = f"; short extends off ({EXTEND_ENV}=0)"
    return native, NativeStatus("on", f"{detail}; threads {native.describe_threads()}{extends}")
