"""Decode tokens/s of the bundled runtime with and without speculative decoding, and the accept length per
algorithm, in-process on one engine per configuration (no HTTP: the numbers are the engine's own).

    python benchmarks/spec_decode.py [--model-path DIR] [--requests 4] [--max-new-tokens 96] [--steps 3]
        [--threads 1] [--configs plain NGRAM STANDALONE]

Without --model-path the demo model is built in a temporary directory (`python -m runtime.demo_model`).
STANDALONE drafts with --draft-model-path (default: the target itself, the mechanism's ceiling: every draft
is accepted, and the draft costs as much as the target). Greedy outputs of every configuration are compared
with plain decoding; a mismatch is reported and exits 1.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PROMPTS = (
    "The keeper climbed the one hundred and twelve steps of the tower before sunrise, as he had done every "
    "day for eleven years. The keeper climbed the",
    "wind north, strong; visibility good; two fishing boats left the harbor. wind north, strong; visibility",
    "Count from one to twenty: one, two, three, four, five, six, seven, eight,",
    "He wrote in his notebook: He wrote in his notebook: He wrote in his notebook:",
)


@dataclass
class Result:
    name: str
    decode_tokens: int
    decode_seconds: float
    accept_length: float | None  # completion_tokens / spec_verify_ct over the requests (SGLang's meta_info)
    accept_rate: float | None
    outputs: dict[str, list[int]]

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def run(name: str, model: Path, draft: Path, args: argparse.Namespace) -> Result:
    from runtime.core.config import EngineArgs
    from runtime.core.requests import GenerateRequest, RequestOutput, SamplingParams
    from runtime.engine.engine_core import EngineCore

    spec: dict[str, object] = {}
    if name != "plain":
        spec = {"speculative_algorithm": name, "speculative_num_steps": args.steps}
        if name == "STANDALONE":
            spec["speculative_draft_model_path"] = str(draft)
    budget = args.memory_budget_gib
    core = EngineCore(EngineArgs(model_path=str(model), memory_budget_gib=budget, **spec))  # type: ignore[arg-type]
    assert core.tokenizer is not None
    outputs: dict[str, list[RequestOutput]] = {}
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens, ignore_eos=True)
    for i in range(args.requests):
        ids = core.tokenizer.encode(PROMPTS[i % len(PROMPTS)]).ids
        core.scheduler.add_request(
            GenerateRequest(f"r{i}", list(ids), sampling), lambda o: outputs.setdefault(o.rid, []).append(o)
        )
    # Decode phase: from the moment every request has its first token (prefill done) to the end.
    while len(outputs) < args.requests or core.scheduler.waiting or any(r.in_prefill for r in core.scheduler.running):
        core.step()
    first = {rid: sum(len(o.new_token_ids) for o in outs) for rid, outs in outputs.items()}
    t0 = time.perf_counter()
    while core.scheduler.has_work:
        core.step()
    seconds = time.perf_counter() - t0
    finals = [outs[-1] for outs in outputs.values()]
    tokens = sum(f.completion_tokens for f in finals) - sum(first.values())
    verify = sum(f.spec_verify_ct for f in finals)
    proposed = sum(f.spec_num_proposed_drafts for f in finals)
    return Result(
        name,
        tokens,
        seconds,
        sum(f.completion_tokens for f in finals) / verify if verify else None,
        sum(f.spec_num_correct_drafts for f in finals) / proposed if proposed else None,
        {rid: [t for o in outs for t in o.new_token_ids] for rid, outs in outputs.items()},
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", type=Path)
    p.add_argument("--draft-model-path", type=Path, help="STANDALONE draft (default: the target itself).")
    p.add_argument("--requests", type=int, default=4, help="Requests decoded together.")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--steps", type=int, default=3, help="--speculative-num-steps")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads.")
    p.add_argument("--configs", nargs="+", default=["plain", "NGRAM", "STANDALONE"])
    p.add_argument("--memory-budget-gib", type=float, default=4.0, help="the engine's budget, weights included")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    model = args.model_path
    if model is None:
        from runtime.demo_model import build_demo_model

        model = Path(build_demo_model(Path(tempfile.mkdtemp(prefix="spec-bench-")) / "demo"))
    draft = args.draft_model_path or model
    results = [run(name, model, draft, args) for name in args.configs]
    base = next((r for r in results if r.name == "plain"), None)
    print(f"model {model}, {args.requests} requests x {args.max_new_tokens} new tokens, steps {args.steps}, "
          f"{args.threads} thread(s)")  # fmt: skip
    print("| config | decode tok/s | vs plain | accept length | accept rate | greedy = plain |")
    print("|---|---|---|---|---|---|")
    ok = True
    for r in results:
        same = base is None or r.outputs == base.outputs
        ok &= same
        speed = f"{r.tokens_per_s / base.tokens_per_s:.2f}x" if base and base.tokens_per_s else "-"
        length = f"{r.accept_length:.2f}" if r.accept_length is not None else "-"
        rate = f"{r.accept_rate:.2f}" if r.accept_rate is not None else "-"
        print(f"| {r.name} | {r.tokens_per_s:.1f} | {speed} | {length} | {rate} | {'yes' if same else 'NO'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
