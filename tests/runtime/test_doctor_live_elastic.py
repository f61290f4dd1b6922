"""ELASTIC_TIMEOUT for real: an elastic pool whose state side starts with one request's worth of slots and a
0.2 s reallocation deadline, under two long concurrent generations. The doctor predicts it from the config, the
bundled runtime logs the timeout, the doctor finds that line, and after `doctor --fix` the same workload
completes with no timeout.

"Fixed" here means: the fix turns the elastic pool off (a fixed KV / state split, so no move exists that could
time out) and, from the MAMBA_POOL_ALLOC finding the same config triggers, gives the state pool two requests'
worth of slots from the start; the same two requests then both complete, the log has no timeout line, and
/metrics has no elastic counters at all."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from runtime.kvcache.elastic_pool import TIMEOUT_MESSAGE
from tests.runtime.conftest import RunningServer, start_runtime_server
from tests.runtime.test_doctor_live import doctor, fix, runtime_flags

pytestmark = pytest.mark.slow

# One chunk of the demo model's elastic buffer is one state slot or ~114 KV tokens: a 462-token request pins
# almost every KV chunk of a 512-token pool, so the second request's state slots cannot be carved from KV.
BODY = {"input_ids": [5] * 12, "sampling_params": {"temperature": 0, "max_new_tokens": 450, "ignore_eos": True}}


def two_long_requests(server: RunningServer) -> list[dict]:
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: httpx.post(server.url + "/generate", json=BODY, timeout=300),
                                range(2)))  # fmt: skip
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    return [a.json() for a in answers]


def test_elastic_timeout_predicted_seen_and_fixed(demo_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nmodel_path = "{demo_model_dir}"\nengine = "builtin"\n[memory]\nmemory_budget_gib = 0.5\n'
        "max_mamba_cache_size = 4  # one request's worth\nenable_elastic_memory_pool = true\n"
        "elastic_realloc_timeout_s = 0.2\n[extra_engine_args]\nmax-total-tokens = 512\n",
        encoding="utf-8",
    )
    (tmp_path / "settings.json").write_text("{}\n", encoding="utf-8")

    predicted = [f for f in doctor(config).findings if f.code == "ELASTIC_TIMEOUT"]
    assert [(f.severity, f.source) for f in predicted] == [("warning", "config")]
    assert "elastic_realloc_timeout_s = 0.2" in predicted[0].cause

    flags = [*runtime_flags(config), "--enable-metrics"]
    assert "--enable-elastic-memory-pool" in flags
    with start_runtime_server(demo_model_dir, *flags, log_dir=tmp_path / "elastic") as server:
        before = [a["output_ids"] for a in two_long_requests(server)]
        log = server.log_path
    assert TIMEOUT_MESSAGE in log.read_text(encoding="utf-8")

    seen = [f for f in doctor(config, log).findings if f.source == "log"]
    assert [(f.code, f.severity) for f in seen] == [("ELASTIC_TIMEOUT", "error")]
    assert seen[0].line is not None and TIMEOUT_MESSAGE in (seen[0].evidence or "")
    assert seen[0].changes == predicted[0].changes  # the log and the config lead to the same edit

    res = fix(config)
    assert "+enable_elastic_memory_pool = false" in res.stdout, res.stdout + res.stderr
    assert "+max_mamba_cache_size = 8" in res.stdout, res.stdout + res.stderr
    assert [f for f in doctor(config).findings if f.code in ("ELASTIC_TIMEOUT", "MAMBA_POOL_ALLOC")] == []
    flags = [*runtime_flags(config), "--enable-metrics"]
    assert "--enable-elastic-memory-pool" not in flags
    with start_runtime_server(demo_model_dir, *flags, log_dir=tmp_path / "fixed") as server:
        after = [a["output_ids"] for a in two_long_requests(server)]
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert after == before  # greedy: the split changes when requests run, never what they produce
    assert TIMEOUT_MESSAGE not in server.log_text() and "runtime:elastic_" not in metrics
    assert [f for f in doctor(config, server.log_path).findings if f.source == "log"] == []
