"""Size the two pools with the planner's `size_pools` (the one source of truth), allocate them, log them.

With `--enable-torch-compile` on CPU each pool's tensors are allocated at a canonical slot count (the next power
of two), while the pool the engine uses (admission, /server_info, the planner's numbers) keeps its planned size:
the compiled graphs take the buffers' shapes as constants, so flag sets whose pools round to the same size share
their graphs in inductor's on-disk cache instead of compiling cold per pool size. The extra slots are
`torch.empty` pages never handed out, so never written and never resident (benchmarks/resident_memory.py).

Bytes per request and per token come from `hybridshared.model.shape.load_model_shape` (shapes) at the dtypes the
runtime really allocates (`runtime_state_bytes`, as `plan` computes them), and are checked against the allocated
tensors. One deviation from SGLang: the conv
window is kept in the activation dtype, not bfloat16, so a prompt computed in chunks is bit-identical to one
computed at once (the window is re-read between chunks).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from hybridshared.model.shape import ModelShape, load_model_shape
from hybridshared.sizing.pool_sizing import PoolPlan, PoolSizingError
from hybridshared.sizing.runtime_pools import (
    RuntimePoolInputs,
    checkpoint_dtype,
    pool_dtype,
    runtime_device_bytes,
    runtime_dtype,
    runtime_state_bytes,
    size_builtin_pools,
)
from runtime.core.batch import ModelLayout, PoolBuffers
from runtime.core.buffers import allocate_pool_buffers, pool_buffer_bytes
from runtime.core.config import EngineArgs

logger = logging.getLogger("runtime.engine")

GB = 1 << 30
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class EngineStartupError(RuntimeError):
    """The engine cannot start with these options; the message names the key to change."""


@dataclass
class Pools:
    buffers: PoolBuffers
    plan: PoolPlan
    spec: ModelShape
    strategy: str  # resolved: no_buffer | extra_buffer
    num_state_slots: int  # usable slots (the pool's padding slot excluded)
    num_token_slots: int
    context_len: int
    inputs: RuntimePoolInputs  # what the sizing formula took (device memory, budget, the options)
    # Speculative decoding's per-draft scratch states (runtime/speculative/sandbox.py): buffer slots
    # [sandbox_first_slot, sandbox_first_slot + sandbox_slots), after the pool's K + 1.
    sandbox_first_slot: int = 0
    sandbox_slots: int = 0
    # Slots the buffers were allocated with (>= the pool's: canonical sizes for the compiled graphs, see above).
    allocated_token_slots: int = 0
    allocated_state_slots: int = 0

    def used_bytes(self) -> tuple[int, int, int]:
        """(KV, conv, SSM) bytes of the slots the engine uses; the allocation's rounding is not counted."""
        b, tokens, states = self.buffers, self.plan.max_total_num_tokens, self.sandbox_first_slot + self.sandbox_slots
        return (
            _bytes([t[:tokens] for t in (*b.k, *b.v)]),
            _bytes([t[:states] for t in b.conv]),
            _bytes([t[:states] for t in b.ssm]),
        )


def canonical_slots(used: int) -> int:
    """The slot count a compiled path's pool is allocated with: the next power of two, so that any pool size
    maps onto one of a few graph variants."""
    return 1 << max(0, used - 1).bit_length()


def _canonical_allocation(args: EngineArgs) -> bool:
    # CPU only: there a torch.empty page costs nothing until written; a CUDA allocation is resident at once.
    # The elastic pool lays its own buffer out (and stays eager: compile_support.pools_traceable).
    return args.enable_torch_compile and args.device == "cpu" and not args.enable_elastic_memory_pool


def resolve_torch_dtype(name: str) -> torch.dtype:
    table = {
        "float32": torch.float32,
        "float": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
        "half": torch.float16,
    }
    if name not in table:
        raise EngineStartupError(f"dtype {name!r} is not supported; use auto, float32, bfloat16 or float16.")
    return table[name]


def model_dtype(args: EngineArgs) -> torch.dtype:
    """The weights' and activations' dtype: --dtype, `auto` resolved from the checkpoint by the planner's rule
    (`runtime_dtype`: the one rule `plan` and the runtime share)."""
    stored = checkpoint_dtype(Path(args.model_path) / "config.json")
    try:
        name = runtime_dtype(args.dtype, stored, on_gpu=args.device != "cpu")
    except ValueError:
        name = str(args.dtype)  # an unknown name: refused below with the names that work
    return resolve_torch_dtype(name)


def device_memory_bytes(args: EngineArgs, weight_bytes: int) -> int:
    """The memory the pools are sized from. CUDA: what was free before the weights loaded (free now plus the
    weights, as SGLang measures it), capped at --memory-budget-gib; not the device's total, which other
    processes and the CUDA context already use."""
    if args.device.startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(args.device))
        return runtime_device_bytes(args.memory_budget_gib, int(free) + weight_bytes)
    return runtime_device_bytes(args.memory_budget_gib, None)


def pool_inputs(
    args: EngineArgs, spec: ModelShape, weight_bytes: int, device_bytes: int, draft_tokens: int
) -> RuntimePoolInputs:
    """What this engine sizes its pools from: its options, the model's shapes at the dtypes it holds them."""
    return RuntimePoolInputs(
        device_bytes=device_bytes,
        mem_fraction_static=args.mem_fraction_static,
        weight_bytes=weight_bytes,
        state_bytes_per_request=spec.mamba_state_bytes_per_request,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        strategy=args.mamba_radix_cache_strategy,
        page_size=args.page_size,
        mamba_track_interval=args.mamba_track_interval,
        mamba_full_memory_ratio=args.mamba_full_memory_ratio,
        max_mamba_cache_size=args.max_mamba_cache_size,
        max_running_requests=args.max_running_requests,
        disable_radix_cache=args.disable_radix_cache,
        context_len=args.context_length or spec.context_len,
        max_total_tokens=args.max_total_tokens,
        speculative_num_draft_tokens=draft_tokens,
    )


def size_and_allocate(
    args: EngineArgs, layout: ModelLayout, weight_bytes: int, dtype: torch.dtype, draft_tokens: int = 0
) -> Pools:
    """`draft_tokens`: tokens per speculative verify (0: off); sizes the sandbox as SGLang's scratch."""
    kv_dtype = conv_dtype = resolve_torch_dtype(pool_dtype(_DTYPE_NAMES[dtype], on_gpu=args.device != "cpu"))
    ssm_dtype = resolve_torch_dtype(args.mamba_ssm_dtype or "float32")
    spec = load_model_shape(args.model_path, ssm_dtype=args.mamba_ssm_dtype, kv_dtype=_DTYPE_NAMES[kv_dtype])
    if spec.ssm_dtype != _DTYPE_NAMES[ssm_dtype]:
        ssm_dtype = resolve_torch_dtype(spec.ssm_dtype)  # the model config's mamba_ssm_dtype
    _check_shapes(spec, layout)
    conv, ssm, per_request = runtime_state_bytes(
        spec.conv_state_shape,
        spec.ssm_state_shape,
        spec.num_linear_layers,
        act=_DTYPE_NAMES[conv_dtype],
        ssm=_DTYPE_NAMES[ssm_dtype],
    )
    spec = replace(spec, conv_dtype=_DTYPE_NAMES[conv_dtype], conv_state_bytes=conv, ssm_state_bytes=ssm,
                   mamba_state_bytes_per_request=per_request)  # fmt: skip
    inputs = pool_inputs(args, spec, weight_bytes, device_memory_bytes(args, weight_bytes), draft_tokens)
    try:  # THE sizing function: plan, init and doctor call the same one for engine = "builtin"
        sized = size_builtin_pools(inputs)
    except PoolSizingError as exc:
        raise EngineStartupError(f"{exc} (bundled runtime: --memory-budget-gib sets the device memory)") from None
    plan, context_len = sized.plan, args.context_length or spec.context_len
    if sized.capped_to_need:  # the budget is an upper bound: pools hold what the request cap can use
        logger.info("Pools cut to need (%d requests x %d tokens): %s", plan.max_running_requests, context_len,
                    sized.capped_to_need)  # fmt: skip
    if args.max_running_requests is not None and plan.max_running_requests < args.max_running_requests:
        # SGLang caps it silently; a user who asked for N concurrent requests should learn why N - 1 run.
        logger.warning(
            "--max-running-requests %d: the %s holds %d (%d state slots, %d per request); raise "
            "--memory-budget-gib (memory.memory_budget_gib) for more",
            args.max_running_requests, plan.limited_by.replace("_", " "), plan.max_running_requests,
            plan.max_mamba_cache_size, plan.slots_per_request,
        )  # fmt: skip
    sandbox_slots = plan.spec_intermediate_bytes // per_request
    buffers, token_slots, state_slots = _allocate(args, layout, plan, sandbox_slots, kv_dtype, conv_dtype, ssm_dtype)
    return Pools(
        buffers=buffers,
        plan=plan,
        spec=spec,
        strategy=sized.strategy,
        num_state_slots=plan.max_mamba_cache_size,
        num_token_slots=plan.max_total_num_tokens,
        context_len=context_len,
        inputs=inputs,
        sandbox_first_slot=plan.mamba_pool_slots,
        sandbox_slots=sandbox_slots,
        allocated_token_slots=token_slots,
        allocated_state_slots=state_slots,
    )


def _allocate(
    args: EngineArgs,
    layout: ModelLayout,
    plan: PoolPlan,
    sandbox_slots: int,
    kv_dtype: torch.dtype,
    conv_dtype: torch.dtype,
    ssm_dtype: torch.dtype,
) -> tuple[PoolBuffers, int, int]:
    """The pool buffers (at canonical sizes for the compiled path on CPU, see the module doc), checked against the
    plan's bytes and logged; with the token and state slots they were allocated with."""
    # With the elastic pool the split's tensors are replaced at once by one buffer of the same bytes
    # (kvcache/elastic_pool.make_elastic): give them no memory ("meta"), or start-up would zero the bytes twice.
    token_slots, state_slots = plan.max_total_num_tokens, plan.mamba_pool_slots + sandbox_slots
    buffers = None
    if _canonical_allocation(args):
        try:
            buffers = allocate_pool_buffers(
                layout, canonical_slots(token_slots), canonical_slots(state_slots),
                kv_dtype=kv_dtype, conv_dtype=conv_dtype, ssm_dtype=ssm_dtype, device=args.device,
            )  # fmt: skip
            token_slots, state_slots = canonical_slots(token_slots), canonical_slots(state_slots)
        except RuntimeError as exc:  # address space refused (strict overcommit): the planned sizes then
            logger.warning("Pool tensors at their planned sizes (canonical sizes refused: %s)", str(exc)[:200])
    if buffers is None:
        buffers = allocate_pool_buffers(
            layout,
            token_slots,
            state_slots,
            kv_dtype=kv_dtype,
            conv_dtype=conv_dtype,
            ssm_dtype=ssm_dtype,
            device="meta" if args.enable_elastic_memory_pool else args.device,
        )
    planned = pool_buffer_bytes(
        layout,
        plan.max_total_num_tokens,
        plan.mamba_pool_slots + sandbox_slots,
        kv_dtype=kv_dtype,
        conv_dtype=conv_dtype,
        ssm_dtype=ssm_dtype,
    )
    actual = _bytes(
        [t[: plan.max_total_num_tokens] for t in (*buffers.k, *buffers.v)]
        + [t[: plan.mamba_pool_slots + sandbox_slots] for t in (*buffers.conv, *buffers.ssm)]
    )
    if not (planned == actual == plan.mamba_pool_bytes + plan.spec_intermediate_bytes + plan.kv_pool_bytes):
        raise EngineStartupError(
            f"internal: allocated pool bytes {actual} differ from the plan "
            f"({plan.mamba_pool_bytes} state + {plan.kv_pool_bytes} KV); the model layout and "
            f"hybridshared.model.shape disagree about {args.model_path}/config.json."
        )
    _log_pools(buffers, plan, kv_dtype, sandbox_slots)
    if (token_slots, state_slots) != (plan.max_total_num_tokens, plan.mamba_pool_slots + sandbox_slots):
        logger.info(
            "Pool tensors allocated at canonical sizes for the compiled graphs: %d token slots, %d state slots "
            "(the pools use %d and %d; the rest is never written, so never resident)",
            token_slots,
            state_slots,
            plan.max_total_num_tokens,
            plan.mamba_pool_slots + sandbox_slots,
        )
    return buffers, token_slots, state_slots


def _check_shapes(spec: ModelShape, layout: ModelLayout) -> None:
    ours = (layout.attn_layer_ids, layout.linear_layer_ids, layout.conv_state_shape, layout.ssm_state_shape)
    theirs = (spec.attn_layer_ids, spec.linear_layer_ids, spec.conv_state_shape, spec.ssm_state_shape)
    if tuple(map(tuple, ours)) != tuple(map(tuple, theirs)):
        raise EngineStartupError(
            f"internal: the model's layout {ours} differs from hybridshared.model.shape's {theirs} for "
            f"{spec.source}; pool sizes would be wrong."
        )


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _log_pools(buffers: PoolBuffers, plan: PoolPlan, kv_dtype: torch.dtype, sandbox_slots: int) -> None:
    # SGLang's wording (mem_cache/memory_pool.py), so log-reading tools work on both engines; the pools' own
    # slots, not the allocation's canonical rounding.
    slots, end, tokens = plan.mamba_pool_slots, plan.mamba_pool_slots + sandbox_slots, plan.max_total_num_tokens
    line = (
        f"Mamba Cache is allocated. max_mamba_cache_size: {plan.max_mamba_cache_size}, "
        f"conv_state size: {_bytes([t[:slots] for t in buffers.conv]) / GB:.2f}GB, "
        f"ssm_state size: {_bytes([t[:slots] for t in buffers.ssm]) / GB:.2f}GB "
    )
    if plan.spec_intermediate_bytes:  # speculative decoding's sandbox slots, after the pool's own
        line += (
            f"intermediate_ssm_state_cache size: {_bytes([t[slots:end] for t in buffers.ssm]) / GB:.2f}GB "
            f"intermediate_conv_window_cache size: {_bytes([t[slots:end] for t in buffers.conv]) / GB:.2f}GB "
        )
    logger.info(line)
    logger.info(
        f"KV Cache is allocated. dtype: {kv_dtype}, #tokens: {plan.max_total_num_tokens}, "
        f"K size: {_bytes([t[:tokens] for t in buffers.k]) / GB:.2f} GB, "
        f"V size: {_bytes([t[:tokens] for t in buffers.v]) / GB:.2f} GB"
    )
