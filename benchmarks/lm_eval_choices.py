"""lm-evaluation-harness on the bundled runtime vs on transformers, same weights: the same per-item choices.

Scores the local multiple-choice task in benchmarks/lm_eval_task/ (12 questions, jsonl next to the YAML, no hub)
twice with lm-eval 0.4.x: `local-completions` against a runtime server (completions with `echo` and `logprobs`:
prompt log-probabilities) and `hf` on the same model directory. Each question's choice is the argmax of the
choices' log-likelihoods; the two runs must pick the same one for every question. Prints a JSON report:
per-item choices, accuracy of each, the largest log-likelihood difference.

lm-eval lives in its own venv (it pulls datasets, pyarrow, scikit-learn, ...; no triton): `ensure_lm_eval`
creates `.cache/lm-eval-venv` with `--system-site-packages` (torch and transformers come from the system) and
installs `lm-eval[api,hf]` there.

    python benchmarks/lm_eval_choices.py --model-dir DIR [--url http://127.0.0.1:PORT] [--out report.json]

Without --url it starts `python -m runtime --model-path DIR --dtype float32` on a free loopback port.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
TASK_DIR = Path(__file__).resolve().parent / "lm_eval_task"
TASK = "hybrid_mc"
LM_EVAL_VERSION = "0.4.13"
VENV = REPO / ".cache" / "lm-eval-venv"


def ensure_lm_eval(venv: Path = VENV) -> Path:
    """The venv's python with lm-eval installed (created on first use; needs PyPI)."""
    python = venv / "bin" / "python"
    # The api and hf extras: local-completions needs tenacity, the hf model accelerate and peft.
    probe = "import importlib.metadata as m, tenacity, accelerate, peft; print(m.version('lm_eval'))"
    if python.is_file():
        found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip() == LM_EVAL_VERSION:
            return python
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"lm-eval[api,hf]=={LM_EVAL_VERSION}"], check=True)
    return python


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def runtime_server(model_dir: Path, log_path: Path):  # type: ignore[no-untyped-def]
    port = _free_port()
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(model_dir), "--port", str(port), "--dtype", "float32",
           "--served-model-name", "lm-eval-target"]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"runtime exited with {proc.returncode}; log {log_path}")
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        else:
            raise RuntimeError(f"runtime not healthy after 300 s; log {log_path}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def prompt_logprobs_supported(url: str) -> str | None:
    """None when /v1/completions answers echo + logprobs (what local-completions needs), else the refusal."""
    body = {"model": "lm-eval-target", "prompt": "Hi there", "max_tokens": 1, "echo": True, "logprobs": 1,
            "temperature": 0}  # fmt: skip
    response = httpx.post(url + "/v1/completions", json=body, timeout=60)
    return None if response.status_code == 200 else f"HTTP {response.status_code}: {response.text[:200]}"


def run_lm_eval(
    python: Path, model: str, model_args: str, out_dir: Path, extra: tuple[str, ...] = ()
) -> dict[int, list[float]]:
    """Per question (doc_id): each choice's log-likelihood, from lm-eval's logged samples."""
    cmd = [str(python), "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks", TASK,
           "--include_path", str(TASK_DIR), "--batch_size", "1", "--log_samples",
           "--output_path", str(out_dir), *extra]  # fmt: skip
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)  # lm-eval's interpreter: the project is not imported there
    done = subprocess.run(cmd, cwd=TASK_DIR, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"lm-eval --model {model} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    samples = sorted(out_dir.rglob(f"samples_{TASK}_*.jsonl"))
    if not samples:
        raise RuntimeError(f"lm-eval --model {model} wrote no samples under {out_dir}")
    scores: dict[int, list[float]] = {}
    for line in samples[-1].read_text().splitlines():
        doc = json.loads(line)
        scores[int(doc["doc_id"])] = [float(r[0]) for r in doc["filtered_resps"]]
    return scores


def compare(runtime: dict[int, list[float]], hf: dict[int, list[float]], golds: list[int]) -> dict[str, Any]:
    items = []
    for doc_id in sorted(hf):
        a, b = runtime[doc_id], hf[doc_id]
        pick_a, pick_b = max(range(len(a)), key=a.__getitem__), max(range(len(b)), key=b.__getitem__)
        items.append({"doc_id": doc_id, "runtime_choice": pick_a, "hf_choice": pick_b, "gold": golds[doc_id],
                      "max_abs_loglik_diff": max(abs(x - y) for x, y in zip(a, b, strict=True))})  # fmt: skip
    return {
        "items": items,
        "same_choices": sum(i["runtime_choice"] == i["hf_choice"] for i in items),
        "n": len(items),
        "acc_runtime": sum(i["runtime_choice"] == i["gold"] for i in items) / len(items),
        "acc_hf": sum(i["hf_choice"] == i["gold"] for i in items) / len(items),
        "max_abs_loglik_diff": max(i["max_abs_loglik_diff"] for i in items),
    }


def evaluate(model_dir: Path, url: str, python: Path, work: Path) -> dict[str, Any]:
    completions = (f"model=lm-eval-target,base_url={url}/v1/completions,tokenizer={model_dir},"
                   "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=1,max_retries=1")  # fmt: skip
    runtime = run_lm_eval(python, "local-completions", completions, work / "runtime")
    hf = run_lm_eval(python, "hf", f"pretrained={model_dir},dtype=float32", work / "hf", ("--device", "cpu"))
    golds = [json.loads(line)["answer"] for line in (TASK_DIR / f"{TASK}.jsonl").read_text().splitlines()]
    return compare(runtime, hf, golds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="model directory (weights + tokenizer)")
    parser.add_argument("--url", help="a running runtime started with --dtype float32 (default: start one)")
    parser.add_argument("--out", type=Path, help="write the JSON report here as well")
    args = parser.parse_args(argv)
    python = ensure_lm_eval()
    with tempfile.TemporaryDirectory(prefix="lm-eval-") as tmp:
        work = Path(tmp)
        if args.url:
            report = evaluate(args.model_dir.resolve(), args.url.rstrip("/"), python, work)
        else:
            with runtime_server(args.model_dir.resolve(), work / "server.log") as url:
                problem = prompt_logprobs_supported(url)
                if problem is not None:
                    print(f"the runtime refuses completions echo + logprobs: {problem}", file=sys.stderr)
                    return 2
                report = evaluate(args.model_dir.resolve(), url, python, work)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if report["same_choices"] == report["n"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
