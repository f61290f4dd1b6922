"""Device memory -> the budget both pools share, following SGLang 0.5.23's static-memory rules.

- GPU-size tiers for chunked_prefill_size and the decode CUDA-graph batch size:
  arg_groups/memory_hook.py:89-170 (`_handle_gpu_memory_settings`).
- The automatic --mem-fraction-static: memory_hook.py:279-325 (reserve activations + graphs, 10 GiB floor on
  GPUs over 60 GiB) and memory_hook.py:360-399 (`reserve_for_graph_mb`: decode and prefill graphs).
- Pool budget: mem_cache/kv_cache_configurator.py:2990-3060 (`_profile_available_bytes`): free memory after
  the weights minus `pre_model_load_memory * (1 - mem_fraction_static)`. With the whole device free before
  loading that is `gpu_mem * mem_fraction_static - weights`. The CUDA context and NCCL buffers are not
  modelled, so real pools come out slightly smaller (see docs/planner.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hybridshared.sizing.pool_sizing import PoolSizingError
from hybridshared.units import GIB, MIB

# The bundled runtime's memory budget: hybridctl/planner/builtin_sizing.py (builtin_device_bytes).


@dataclass(frozen=True)
class GpuTier:
    chunked_prefill_size: int
    decode_graph_max_bs: int
    label: str


def gpu_tier(gpu_mem_bytes: int | None, tp: int) -> GpuTier:
    """memory_hook.py:89-170: SGLang's defaults by device size (MiB thresholds)."""
    if gpu_mem_bytes is None:
        return GpuTier(4096, 160, "unknown GPU")
    mib = gpu_mem_bytes / MIB
    if mib < 20 * 1024:
        return GpuTier(2048, 8, "< 20 GiB (T4, 4080)")
    if mib < 35 * 1024:
        return GpuTier(4096, 48 if tp < 4 else 160, "20-35 GiB (A10, 4090, 5090)")
    if mib < 60 * 1024:
        return GpuTier(4096, 32 if tp < 4 else 160, "35-60 GiB (A100-40G, L40)")
    if mib < 90 * 1024:
        return GpuTier(8192, 256 if tp < 4 else 512, "60-90 GiB (H100, A100-80G)")
    if mib < 160 * 1024:
        return GpuTier(8192, 256 if tp < 4 else 512, "90-160 GiB (H20, H200)")
    return GpuTier(16384, 512, ">= 160 GiB (B200, MI300)")


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """cuda_graph_hook.py:480-497 (`generate_prefill_cuda_graph_batch_sizes`): the captured token counts."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_bs + 1, 512),
    ]
    return [s for s in sizes if s <= max_bs]


def auto_mem_fraction_static(
    gpu_mem_bytes: int,
    *,
    tp: int,
    chunked_prefill_size: int | None = None,
    max_running_requests: int | None = None,
    prefill_graph: bool = True,
    mla: bool = False,
) -> float:
    """memory_hook.py:279-325 for a plain (not PD, no DP attention) CUDA server.

    `prefill_graph`: the breakable prefill CUDA graph, on by default on CUDA (cuda_graph_config.py:119-123)
    and turned off for KDA models such as Kimi-Linear (cuda_graph_hook.py:170-192).
    """
    tier = gpu_tier(gpu_mem_bytes, tp)
    chunk = chunked_prefill_size if chunked_prefill_size and chunked_prefill_size > 0 else tier.chunked_prefill_size
    graph_bs = tier.decode_graph_max_bs
    if max_running_requests is not None:
        graph_bs = min(graph_bs, max_running_requests)  # memory_hook.py:172-178
    gpu_mib = gpu_mem_bytes / MIB
    reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + graph_bs * 2
    if prefill_graph:
        # memory_hook.py:383-397: 8 MiB per captured prefill size (max = the chunk), a flat 1.5 GiB for MLA.
        reserved += 1.5 * 1024 if mla else len(prefill_graph_sizes(chunk)) * 8
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def vlm_mem_fraction_factor(vit_num_layers: int, vit_hidden_size: int) -> float:
    """memory_hook.py:432-462 (`adjust_mem_fraction_for_vlm`): scale the fraction down for the vision encoder.

    0.95 for a ViT-L/14-sized tower, 10% less per doubling of layers x hidden^2, clamped to 0.8..1.05.
    """
    complexity = (vit_num_layers * vit_hidden_size**2) / (24 * 1024**2)
    dynamic = max(0.8, min(1.05, 1.0 - 0.1 * (complexity - 1.0)))
    return 0.95 * dynamic


def pool_bytes_for(gpu_mem_bytes: int, *, mem_fraction_static: float, weights_bytes_per_rank: int) -> int:
    """Bytes left for both pools on one GPU; PoolSizingError when the weights do not fit."""
    static = gpu_mem_bytes * mem_fraction_static
    rest = int(static - weights_bytes_per_rank)
    if rest <= 0:
        needed = weights_bytes_per_rank / gpu_mem_bytes
        head = (
            f"The weights ({weights_bytes_per_rank / GIB:.1f} GiB per GPU) do not fit in mem_fraction_static "
            f"{mem_fraction_static} x {gpu_mem_bytes / GIB:.1f} GiB = {static / GIB:.1f} GiB, so nothing is "
            f"left for the KV and state pools."
        )
        if needed < 0.95:
            fix = (
                f" Raise memory.mem_fraction_static above {needed:.3f}, or shard over more GPUs "
                "(server.tp_size; --tp of plan and init)."
            )
        else:
            # Weights need the whole device or more: only more GPUs help. Keep ~40% for pools and activations.
            factor = math.ceil(weights_bytes_per_rank / (gpu_mem_bytes * 0.6))
            fix = f" Shard the model over about {factor}x more GPUs (server.tp_size; --tp of plan and init)."
        raise PoolSizingError(head + fix)
    return rest
