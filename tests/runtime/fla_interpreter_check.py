"""fla's Gated DeltaNet kernels against the runtime's delta rule, on the CPU under Triton's interpreter: run by
tests/runtime/test_fla_interpreter.py in `.venv-fla` (triton and flash-linear-attention, kept out of the main
environment as sglang's triton is) with TRITON_INTERPRET=1. Prints one JSON object.

- chunk_gated_delta_rule (prefill): two sequences packed with `cu_seqlens`, one of them longer than fla's 64-token
  chunk, each from its own initial state in the pool's layout ([slots, heads, v_dim, k_dim]: `state_v_first`).
- fused_recurrent_gated_delta_rule (decode): one token for each of the same sequences' states.
- decode_model: the runtime's own use of it (runtime/models/layers/fla_kernels.py, forced on for CPU tensors): a tiny
  Qwen3-Next's decode steps, batch 3, with fla's kernel in every Gated DeltaNet layer against the torch step.

Two things the interpreter lacks are supplied here, neither of which changes a kernel's arithmetic: a driver to time
autotuning candidates with (each kernel takes its first config), and tensor-typed loop induction variables (compiled
Triton gives `for i in range(n)` a tensor `i`; fla's chunk kernel calls `i.to(tl.int64)` on it)."""

from __future__ import annotations

import ast
import json
import tempfile
import time
from pathlib import Path

import torch
import triton.runtime.autotuner as autotuner
import triton.runtime.interpreter as interpreter

_prune = autotuner.Autotuner.prune_configs
autotuner.Autotuner.prune_configs = lambda self, kwargs, *a, **k: _prune(self, kwargs, *a, **k)[:1]


def _visit_for(self: ast.NodeTransformer, node: ast.For) -> ast.For:
    """`for i in ...: body` becomes `for i in ...: i = i; body`, and the interpreter makes every assigned value
    a tensor."""
    node = self.generic_visit(node)
    if isinstance(node.target, ast.Name):
        name = node.target.id
        assign = ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=ast.Name(id=name, ctx=ast.Load()))
        node.body.insert(0, ast.copy_location(self.visit_Assign(assign), node))  # type: ignore[attr-defined]
        ast.fix_missing_locations(node)
    return node


interpreter.ASTTransformer.visit_For = _visit_for  # type: ignore[attr-defined]

from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk  # noqa: E402
from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent  # noqa: E402

from runtime.models import load_model  # noqa: E402
from runtime.models.layers import fla_kernels  # noqa: E402
from runtime.models.layers.delta_rule import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_step  # noqa: E402
from tests.runtime.simple_runner import SimpleRunner  # noqa: E402
from tests.runtime.test_engine_support import perturb_weights  # noqa: E402
from tests.runtime.test_model_reference import ARCHS, VOCAB  # noqa: E402

HEADS, K_DIM, V_DIM = 2, 16, 16
LENGTHS = (8, 80)


def decode_model(steps: int = 3, batch: int = 3) -> dict[str, float]:
    """Greedy decode steps of a tiny Qwen3-Next, the torch step against fla's: the largest logit and state
    differences over the steps, and fla's seconds."""
    torch.manual_seed(0)
    hf = ARCHS["qwen3_next"][0]().eval()
    perturb_weights(hf, 1)
    path = Path(tempfile.mkdtemp(prefix="fla-check."))
    hf.save_pretrained(path)
    model = load_model(path)
    runners = [SimpleRunner(model, num_state_slots=batch) for _ in range(2)]
    g = torch.Generator().manual_seed(1)
    prompts = {s: torch.randint(0, VOCAB, (4 + 3 * s,), generator=g).tolist() for s in range(batch)}
    tokens = []
    for runner in runners:
        for s in range(batch):
            runner.add(s)
        tokens = runner.extend(prompts).argmax(-1).tolist()
    logits_diff = state_diff = fla_s = 0.0
    for _ in range(steps):
        out = []
        for use_fla, runner in zip((False, True), runners, strict=True):
            fla_kernels.force_on_cpu = use_fla
            start = time.perf_counter()
            out.append(runner.extend({s: [tokens[s]] for s in range(batch)}))
            fla_s += (time.perf_counter() - start) if use_fla else 0.0
        fla_kernels.force_on_cpu = False
        logits_diff = max(logits_diff, (out[0] - out[1]).abs().max().item())
        for torch_ssm, fla_ssm in zip(runners[0].buffers.ssm, runners[1].buffers.ssm, strict=True):
            state_diff = max(state_diff, (torch_ssm - fla_ssm).abs().max().item())
        tokens = out[0].argmax(-1).tolist()
    return {"steps": steps, "batch": batch, "fla_seconds": round(fla_s, 3), "max_logits_diff": logits_diff,
            "max_state_diff": state_diff}  # fmt: skip


def main() -> None:
    torch.manual_seed(0)
    n, total = len(LENGTHS), sum(LENGTHS)
    q, k = (l2norm(torch.randn(1, total, HEADS, K_DIM)) for _ in range(2))
    v = torch.randn(1, total, HEADS, V_DIM)
    g, beta = -torch.rand(1, total, HEADS) * 0.5, torch.rand(1, total, HEADS)
    states = torch.randn(n, HEADS, V_DIM, K_DIM) * 0.1  # the pool's layout
    bounds = [0, *torch.tensor(LENGTHS).cumsum(0).tolist()]
    start = time.perf_counter()
    out, final = fla_chunk(
        q, k, v, g=g, beta=beta, scale=K_DIM**-0.5, initial_state=states.clone(), output_final_state=True,
        state_v_first=True, cu_seqlens=torch.tensor(bounds),
    )  # fmt: skip
    chunk_s = time.perf_counter() - start
    chunk_out = chunk_state = 0.0
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        ref_out, ref_state = chunk_gated_delta_rule(
            q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], states[i : i + 1].transpose(-1, -2)
        )
        chunk_out = max(chunk_out, (ref_out - out[:, a:b]).abs().max().item())
        chunk_state = max(chunk_state, (ref_state.transpose(-1, -2) - final[i : i + 1]).abs().max().item())
    q1, k1 = (l2norm(torch.randn(n, 1, HEADS, K_DIM)) for _ in range(2))
    v1, g1, b1 = torch.randn(n, 1, HEADS, V_DIM), -torch.rand(n, 1, HEADS) * 0.5, torch.rand(n, 1, HEADS)
    start = time.perf_counter()
    out1, state1 = fla_recurrent(
        q1, k1, v1, g=g1, beta=b1, scale=K_DIM**-0.5, initial_state=states.clone(), output_final_state=True,
        state_v_first=True,
    )  # fmt: skip
    recurrent_s = time.perf_counter() - start
    ref_out1, ref_state1 = recurrent_gated_delta_step(q1[:, 0], k1[:, 0], v1[:, 0], g1[:, 0], b1[:, 0], states)
    print(json.dumps({
        "chunk": {"lengths": list(LENGTHS), "seconds": round(chunk_s, 3), "max_out_diff": chunk_out,
                  "max_state_diff": chunk_state},
        "fused_recurrent": {"sequences": n, "seconds": round(recurrent_s, 3),
                            "max_out_diff": (ref_out1 - out1[:, 0]).abs().max().item(),
                            "max_state_diff": (ref_state1 - state1).abs().max().item()},
        "decode_model": decode_model(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
