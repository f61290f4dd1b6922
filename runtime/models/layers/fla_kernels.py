"""The field's Gated DeltaNet decode kernel on the accelerator path: flash-linear-attention's
`fused_recurrent_gated_delta_rule` (Triton), where the state is on CUDA and the package is installed. Elsewhere, and
inside a torch.compile trace, it does not run and the torch step (runtime/models/layers/delta_rule.py) does: the CPU
path never imports it.

It takes the torch step's contract on the pool's state layout ([slots, HV, V, K]: fla's `state_v_first`), gathered
and scattered by slot around it as the torch step is. `force_on_cpu` (RUNTIME_FLA_KERNELS=1) runs it on CPU tensors
too: tests/runtime/fla_interpreter_check.py does, under Triton's interpreter, against the torch step."""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from typing import Any

import torch

FORCE_ENV = "RUNTIME_FLA_KERNELS"
force_on_cpu = os.environ.get(FORCE_ENV) == "1"


@functools.cache
def _fused_recurrent() -> Callable[..., Any] | None:
    try:
        module = importlib.import_module("fla.ops.gated_delta_rule")
    except ImportError:  # not installed: the torch step runs
        return None
    kernel: Callable[..., Any] = module.fused_recurrent_gated_delta_rule
    return kernel


def fla_decode_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state_vk: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`recurrent_gated_delta_step` through fla's kernel (q, k: [B, H, Dk] l2-normalized; v: [B, H, Dv]; g, beta:
    [B, H]; state_vk: [B, H, Dv, Dk] fp32; returns (out [B, H, Dv] fp32, new state)), or None where it does not
    run. Each sequence is one batch row of one token."""
    if not (state_vk.is_cuda or force_on_cpu) or torch.compiler.is_compiling():
        return None
    kernel = _fused_recurrent()
    if kernel is None:
        return None
    out, state = kernel(
        q.float()[:, None], k.float()[:, None], v.float()[:, None], g=g.float()[:, None], beta=beta.float()[:, None],
        scale=q.shape[-1] ** -0.5, initial_state=state_vk, output_final_state=True, state_v_first=True,
    )  # fmt: skip
    return out[:, 0], state
