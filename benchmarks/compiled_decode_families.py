"""--enable-torch-compile on every model class: compile time, graphs, and greedy identity with the eager engine.

For each tiny architecture of tests/runtime/test_model_reference.py (random HF weights saved locally), one
process per architecture (they would share the compiled code object's cache): an engine with
--enable-torch-compile --torch-compile-max-bs 4 --torch-compile-max-extend-tokens 16 and an eager one decode
the same 5 prompts of different lengths together (batch 5 → 1, so batch 5 runs eager and 4..1 compiled), then
one after another a document + three questions (prefix-cache hits whose short extends cross a state checkpoint)
and two fresh short prompts (compiled extends). Prints both warm-up reports, the compiled decode steps by batch
size and compiled extends by bucket, and whether the greedy tokens are identical.

    python benchmarks/compiled_decode_families.py [ARCH ...]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def check(arch: str) -> None:
    import torch

    from runtime.core.config import EngineArgs
    from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams
    from runtime.engine.engine_core import EngineCore
    from tests.runtime.test_model_reference import ARCHS, _perturb

    torch.set_num_threads(1)
    torch.manual_seed(0)
    hf = ARCHS[arch][0]().eval()
    _perturb(hf, 1)
    path = Path(tempfile.mkdtemp()) / arch
    hf.save_pretrained(path)
    tokens: dict[bool, dict[str, list[int]]] = {}
    for compile_on in (True, False):
        core = EngineCore(
            EngineArgs(
                model_path=str(path),
                memory_budget_gib=0.05,
                max_total_tokens=4096,
                max_mamba_cache_size=64,
                enable_torch_compile=compile_on,
                torch_compile_max_bs=4,
                torch_compile_max_extend_tokens=16,
                mamba_track_interval=16,
            )
        )
        got: dict[str, list[int]] = {}

        def on_output(o: RequestOutput, got: dict[str, list[int]] = got) -> None:
            got.setdefault(o.rid, []).extend(o.new_token_ids)

        for i in range(5):
            prompt = [(7 * i + j) % 150 for j in range(3 + 4 * i)]
            params = SamplingParams(temperature=0, max_new_tokens=5 + 3 * i, ignore_eos=True)
            core.scheduler.add_request(GenerateRequest(f"r{i}", prompt, params), on_output)
        while core.scheduler.has_work:
            core.step()
        doc = [(11 * j + 5) % 150 for j in range(40)]
        one_by_one = [doc + [20 + q, 30 + q, 40 + q][: q + 1] for q in range(3)] + [[9, 8, 7], [3] * 12]
        for i, prompt in enumerate(one_by_one):
            params = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
            core.scheduler.add_request(GenerateRequest(f"s{i}", prompt, params), on_output)
            while core.scheduler.has_work:
                core.step()
        tokens[compile_on] = got
        if core.runner.compiled_decode is not None:
            r = core.runner.compiled_decode.report
            steps = dict(sorted(core.runner.compiled_decode.steps_by_batch_size.items()))
            print(f"{arch}: compiled={r.enabled} graphs={r.graphs} compile={r.elapsed_s:.1f}s steps={steps} {r.reason}")
        if compile_on:
            ce = core.runner.compiled_extend
            if ce is None:
                print(f"{arch}: extends eager (see the warm-up warning above)")
            else:
                buckets = dict(sorted(ce.forwards_by_bucket.items()))
                print(
                    f"{arch}: extends compiled graphs={ce.report.graphs} compile={ce.report.elapsed_s:.1f}s "
                    f"forwards by bucket={buckets} checkpoints {'traced' if ce.traced_checkpoints else 'split'}"
                )
    print(f"{arch}: greedy identical to eager: {tokens[True] == tokens[False]}", flush=True)


def main() -> None:
    sys.path.insert(0, str(REPO))
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        check(sys.argv[2])
        return
    from tests.runtime.test_model_reference import ARCHS

    for arch in sys.argv[1:] or sorted(ARCHS):
        subprocess.run([sys.executable, __file__, "--one", arch], check=True, cwd=REPO)


if __name__ == "__main__":
    main()
