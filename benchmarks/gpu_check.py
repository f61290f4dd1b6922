"""One command that proves the bundled runtime's accelerator path on a device, and rehearses it on the CPU.

    python benchmarks/gpu_check.py --device cuda [--out result.json]
    python benchmarks/gpu_check.py --device cpu          # the same checks as a rehearsal (CI)

Checks (each pass/fail with its numbers, one JSON object out; exit 1 when any fails):
- greedy_fp32: the tiny model of every family (tests/runtime/test_model_reference.py, random weights) decodes the
  same fp32 greedy tokens on the device as on the CPU path (on --device cpu: the accelerator path rehearsed on the
  CPU against the CPU path).
- seeded_sampling: temperature/top-k/top-p sampling with seeded generators on the device repeats exactly.
- bf16_error: each family's runtime logits in bf16 stay within 1.5x transformers' own bf16 error (both against
  transformers in fp32, on the device; the median over tokens of each token's relative error, so that one router
  near-tie broken the other way does not decide it: the whole-logits error is reported beside it).
- readbacks: one extend and one decode step, batch 1 and 8, every family: at most one device-to-host readback per
  step (runtime/core/readbacks.py; emulated on the CPU).
- decode_graph: every family's decode step, batch 1 and 8, captured once in a CUDA graph over input tensors of one
  KV width bucket and replayed, refilled in place, for successive steps: equal to the eager steps in logits and
  pools (on the CPU: the same steps over the static inputs, eagerly; tests/runtime/test_decode_graph.py shows on the
  CPU that the step traces as one static graph with no host read inside).
- decode_throughput: an engine decoding at batch 1 and 32 on a locally built model (cuda: 1.13B parameters of
  random weights, 0.43B read per token at batch 1, bf16; cpu: the demo model): tok/s beside the weights' bytes
  and, where the card reports its memory clock and bus, the bandwidth floor (tok/s if each step only read the
  weights once at full bandwidth). It passes when it runs; how far from the floor it is, it reports.
- prefix_cache: the same engine, a long prompt cold then again warm: cached tokens, both TTFTs, identical tokens.
- doctor_vmm: doctor's host probe (NVML, libcuda) and the runtime's VMM answer agree about the device (on the CPU:
  the probe runs and says why there is no GPU).

Sized to finish in a few minutes on one H100 (the 1.13B checkpoint is written once, 4.5 GB of fp32 in the temp
directory). On the CPU the rehearsal takes about 10 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from runtime.core.batch import PoolBuffers  # noqa: E402
from runtime.core.config import EngineArgs  # noqa: E402
from runtime.core.device_path import rehearse_accelerator_path  # noqa: E402
from runtime.core.readbacks import count_readbacks, model_device_tensors  # noqa: E402
from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams  # noqa: E402
from runtime.demo_model import DEMO_CONFIG, build_demo_model  # noqa: E402
from runtime.engine.compiled_decode import DecodeInputs, decode_step  # noqa: E402
from runtime.engine.engine_core import EngineCore  # noqa: E402
from runtime.models import load_model  # noqa: E402
from runtime.models.base import HybridModel  # noqa: E402
from runtime.scheduler.sampling import greedy_tokens, sample  # noqa: E402
from tests.runtime.simple_runner import SimpleRunner  # noqa: E402
from tests.runtime.test_decode_graph import StepMaker, clone_pools, replay_decode  # noqa: E402
from tests.runtime.test_engine_support import perturb_weights  # noqa: E402
from tests.runtime.test_model_reference import ARCHS, VOCAB  # noqa: E402

# 1.13B parameters (0.43B read per token at batch 1: 4 of 32 experts), the demo model's family (Qwen3-Next) scaled up.
LARGE_CONFIG: dict[str, Any] = {
    **DEMO_CONFIG,
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 512,
}


def family_checkpoints(tmp: Path) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Every family's tiny transformers model (fp32, CPU) saved as a checkpoint."""
    out: dict[str, tuple[Path, torch.nn.Module]] = {}
    for name in sorted(ARCHS):
        torch.manual_seed(0)
        hf: Any = ARCHS[name][0]()
        hf.eval()
        perturb_weights(hf, 1)
        hf.save_pretrained(tmp / name)
        out[name] = (tmp / name, hf)
    return out


def _prompts(batch: int, seed: int) -> dict[int, list[int]]:
    g = torch.Generator().manual_seed(seed)
    return {s: torch.randint(0, VOCAB, (5 + 3 * s,), generator=g).tolist() for s in range(batch)}


def greedy_run(model: HybridModel, batch: int, steps: int) -> list[list[int]]:
    runner = SimpleRunner(model, num_state_slots=batch + 1)
    for s in range(batch):
        runner.add(s)
    out = [[t] for t in greedy_tokens(runner.extend(_prompts(batch, 7)).float())]
    for _ in range(steps - 1):
        last = greedy_tokens(runner.extend({s: [out[s][-1]] for s in range(batch)}).float())
        for s in range(batch):
            out[s].append(last[s])
    return out


def check_greedy_fp32(device: torch.device, ckpts: dict[str, tuple[Path, torch.nn.Module]]) -> dict[str, Any]:
    per: dict[str, bool] = {}
    for name, (path, _) in ckpts.items():
        cpu = greedy_run(load_model(path), 3, 12)
        with _accelerator(device):
            ours = greedy_run(load_model(path, device=str(device)), 3, 12)
        per[name] = ours == cpu
    return {"pass": all(per.values()), "families": per}


def check_seeded_sampling(device: torch.device) -> dict[str, Any]:
    logits = torch.randn(8, 512, generator=torch.Generator().manual_seed(0)).to(device)
    params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02)] * 8

    def draw(seed: int) -> list[int]:
        gens = [torch.Generator(device=device).manual_seed(seed + i) for i in range(8)]
        return [t for _ in range(4) for t in sample(logits, params, gens)]

    first, again, other = draw(1), draw(1), draw(100)
    return {"pass": first == again and first != other, "tokens": first[:8]}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _median_row_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """The median over tokens of each token's relative logit error: a near-tie in an MoE router that bf16 breaks
    the other way (a discrete flip, as likely in transformers as here) moves one token's logits a lot, precision
    lost in a layer moves them all."""
    a, b = a.float(), b.float()
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1)).median())


def check_bf16_error(device: torch.device, ckpts: dict[str, tuple[Path, torch.nn.Module]]) -> dict[str, Any]:
    prompt = _prompts(1, 3)[0] * 4
    per: dict[str, dict[str, float]] = {}
    ok = True
    for name, (path, hf) in ckpts.items():
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            ref = hf.to(device=device, dtype=torch.float32)(ids).logits[0]
            hf_bf16 = hf.to(dtype=torch.bfloat16)(ids).logits[0]
        hf.to(device="cpu", dtype=torch.float32)
        with _accelerator(device):
            runner = SimpleRunner(load_model(path, dtype=torch.bfloat16, device=str(device)))
            runner.add(0)
            ours = runner.extend({0: prompt}, all_logits=True)
        hf_err, our_err = _median_row_rel(hf_bf16, ref), _median_row_rel(ours, ref)
        per[name] = {
            "transformers_bf16": round(hf_err, 5),
            "runtime_bf16": round(our_err, 5),
            "transformers_bf16_all_rows": round(_rel(hf_bf16, ref), 5),
            "runtime_bf16_all_rows": round(_rel(ours, ref), 5),
        }
        ok &= our_err <= 1.5 * hf_err + 1e-3
    return {"pass": ok, "median_token_relative_error_vs_fp32": per}


def check_readbacks(device: torch.device, ckpts: dict[str, tuple[Path, torch.nn.Module]]) -> dict[str, Any]:
    per: dict[str, dict[str, int]] = {}
    for name, (path, _) in ckpts.items():
        with _accelerator(device):
            model = load_model(path, device=str(device))
            for batch in (1, 8):
                runner = SimpleRunner(model, num_state_slots=batch + 1)
                for s in range(batch):
                    runner.add(s)
                tensors = model_device_tensors(model, runner.buffers)
                with count_readbacks(tensors) as extend:
                    first = greedy_tokens(runner.extend(_prompts(batch, 5)).float())
                with count_readbacks(tensors) as decode:
                    greedy_tokens(runner.extend({s: [first[s]] for s in range(batch)}).float())
                per[f"{name}/b{batch}"] = {"extend": extend.total, "decode": decode.total}
    worst = max(max(v.values()) for v in per.values())
    return {"pass": worst <= 1, "max_per_step": worst, "per_step": per}


def graph_step(model: HybridModel, device: torch.device) -> StepMaker:
    """The eager decode step captured once in a CUDA graph over the static inputs and pools, then replayed. The two
    warm-up steps torch.cuda.graph asks for (on a side stream: lazy caches filled, library workspaces made) write
    the pools, so the pools are saved before them and put back after the capture (which runs nothing). On the CPU
    (the rehearsal) the same warm-up, save and restore, and the eager step over the static inputs in place of a
    replay; that the step traces as one static graph is tests/runtime/test_decode_graph.py's to show."""
    step = decode_step(model)
    cuda = device.type == "cuda"

    def make(inputs: DecodeInputs, buffers: PoolBuffers) -> Callable[[], torch.Tensor]:
        saved = clone_pools(buffers)
        side = torch.cuda.Stream() if cuda else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if side is not None else nullcontext(), torch.inference_mode():
            for _ in range(2):
                step(*inputs, buffers)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph() if cuda else None
        out = None
        if graph is not None:
            with torch.inference_mode(), torch.cuda.graph(graph):
                out = step(*inputs, buffers)
        for kind in ("k", "v", "conv", "ssm"):
            for live, kept in zip(getattr(buffers, kind), getattr(saved, kind), strict=True):
                live.copy_(kept)

        def replay() -> torch.Tensor:
            if graph is None or out is None:
                return step(*inputs, buffers)
            graph.replay()
            return out

        return replay

    return make


def check_decode_graph(device: torch.device, ckpts: dict[str, tuple[Path, torch.nn.Module]]) -> dict[str, Any]:
    per: dict[str, Any] = {}
    for name, (path, _) in ckpts.items():
        with _accelerator(device):
            model = load_model(path, device=str(device))
            for batch in (1, 8):
                per[f"{name}/b{batch}"] = replay_decode(model, batch, graph_step(model, device))[:4] or "ok"
    return {"pass": all(v == "ok" for v in per.values()), "per_step": per}


def _engine(model_dir: Path, device: torch.device) -> EngineCore:
    kw: dict[str, Any] = {"max_total_tokens": 40_000, "max_mamba_cache_size": 80}
    if device.type == "cpu":
        kw["memory_budget_gib"] = 1.0
    return EngineCore(EngineArgs(model_path=str(model_dir), device=str(device), **kw))


def _run(core: EngineCore, prompts: list[list[int]], new: int) -> tuple[dict[str, list[int]], float, float, int]:
    """Greedy requests run together: (tokens per request, seconds to every first token, decode tok/s, cached)."""
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    cached = [0]

    def on(out: RequestOutput) -> None:
        got[out.rid] += out.new_token_ids
        cached[0] = max(cached[0], out.cached_tokens)

    params = SamplingParams(temperature=0.0, max_new_tokens=new, ignore_eos=True)
    for i, p in enumerate(prompts):
        core.scheduler.add_request(GenerateRequest(f"r{i}", p, params), on)
    start = time.perf_counter()
    while not all(got.values()):
        core.step()
    ttft = time.perf_counter() - start
    before, t0 = sum(map(len, got.values())), time.perf_counter()
    while core.scheduler.has_work:
        core.step()
    decoded = sum(map(len, got.values())) - before
    return got, ttft, decoded / max(time.perf_counter() - t0, 1e-9), cached[0]


def bandwidth_bytes_per_s(device: torch.device) -> float | None:
    """The card's peak memory bandwidth from its memory clock and bus width (DDR: two transfers a clock), when
    torch reports them."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", None), getattr(props, "memory_bus_width", None)
    return 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else None


def check_decode_throughput(device: torch.device, core: EngineCore, new: int) -> dict[str, Any]:
    cfg = core.model.config
    expert_bytes = sum(p.numel() * p.element_size() for n, p in core.model.named_parameters() if ".experts." in n)
    experts, top_k = getattr(cfg, "num_experts", 1), getattr(cfg, "num_experts_per_tok", 1)
    active_b1 = core.weight_bytes - expert_bytes * (1 - top_k / experts)
    bandwidth = bandwidth_bytes_per_s(device)
    result: dict[str, Any] = {"weight_bytes": core.weight_bytes, "active_bytes_batch1": int(active_b1)}
    for batch in (1, 32):
        _, _, tok_s, _ = _run(core, list(_prompts(batch, 11).values()), new)
        result[f"tok_s_batch{batch}"] = round(tok_s, 1)
    if bandwidth:
        result["bandwidth_gb_s"] = round(bandwidth / 1e9, 1)
        result["floor_tok_s_batch1"] = round(bandwidth / active_b1, 1)
        result["fraction_of_floor_batch1"] = round(result["tok_s_batch1"] / result["floor_tok_s_batch1"], 3)
    result["pass"] = result["tok_s_batch1"] > 0 and result["tok_s_batch32"] > 0
    return result


def check_prefix_cache(core: EngineCore, length: int) -> dict[str, Any]:
    prompt = [(13 * i + 5) % 4000 for i in range(length)]
    cold, cold_ttft, _, _ = _run(core, [prompt], 8)
    warm, warm_ttft, _, cached = _run(core, [prompt], 8)
    return {
        "pass": cached >= length // 2 and warm == cold and warm_ttft < cold_ttft,
        "prompt_tokens": length,
        "cached_tokens": cached,
        "ttft_cold_s": round(cold_ttft, 4),
        "ttft_warm_s": round(warm_ttft, 4),
        "tokens_identical": warm == cold,
    }


def check_doctor_vmm(device: torch.device) -> dict[str, Any]:
    """doctor's host probe (NVML, libcuda) and the runtime's own VMM answer agree about this device: on a GPU both
    see it and both say whether VMM is usable; on the CPU the probe runs without a GPU and says why."""
    from hybridctl.host.probe import probe_host
    from runtime.kvcache.cuda_vmm import vmm_status

    facts = probe_host()
    runtime_vmm = vmm_status(device.index or 0)
    gpus = [{"index": g.index, "name": g.name, "vmm_supported": g.vmm_supported} for g in facts.gpus]
    result: dict[str, Any] = {"doctor_gpus": gpus, "runtime_vmm": runtime_vmm, "skipped": facts.skipped}
    if device.type == "cpu":
        result["pass"] = True  # the probe ran; without a GPU there is nothing to agree on
        return result
    mine = next((g for g in facts.gpus if g.index == (device.index or 0)), None)
    result["pass"] = mine is not None and mine.vmm_supported == (runtime_vmm == "available")
    return result


def _accelerator(device: torch.device) -> AbstractContextManager[None]:
    """The accelerator path: on a GPU by itself; on the CPU rehearsed."""
    return rehearse_accelerator_path() if device.type == "cpu" else nullcontext()


def _guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - one check failing must not hide the others' results
        result = {"pass": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def run_checks(device: torch.device) -> dict[str, Any]:
    cpu = device.type == "cpu"
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check."))
    before = torch.get_num_threads()
    if cpu:
        torch.set_num_threads(1)  # tiny models: more threads only contend
    else:  # fp32 means fp32: cuDNN's convolutions default to TF32 on Ampere and newer
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ckpts = family_checkpoints(tmp / "families")
        checks = {
            "greedy_fp32": _guarded(lambda: check_greedy_fp32(device, ckpts)),
            "seeded_sampling": _guarded(lambda: check_seeded_sampling(device)),
            "bf16_error": _guarded(lambda: check_bf16_error(device, ckpts)),
            "readbacks": _guarded(lambda: check_readbacks(device, ckpts)),
            "decode_graph": _guarded(lambda: check_decode_graph(device, ckpts)),
        }
        model_dir = build_demo_model(tmp / "model", config=None if cpu else LARGE_CONFIG)
        core_box: list[EngineCore] = []

        def engine() -> EngineCore:
            if not core_box:
                core_box.append(_engine(model_dir, device))
            return core_box[0]

        checks["decode_throughput"] = _guarded(lambda: check_decode_throughput(device, engine(), 16 if cpu else 64))
        checks["prefix_cache"] = _guarded(lambda: check_prefix_cache(engine(), 256 if cpu else 2048))
        checks["doctor_vmm"] = _guarded(lambda: check_doctor_vmm(device))
    finally:
        torch.set_num_threads(before)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "device": name,
        "torch": torch.__version__,
        "pass": all(c["pass"] for c in checks.values()),
        "checks": checks,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (the rehearsal)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"pass": False, "error": "no CUDA device visible to torch"}))
        return 1
    report = run_checks(device)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
