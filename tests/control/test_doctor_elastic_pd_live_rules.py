"""The doctor rules the live loops (tests/runtime/test_doctor_live_*.py) rely on, checked without a runtime:
ELASTIC_TIMEOUT predicted for the bundled runtime's elastic pool, elastic pool and PD not reported as
unimplemented by the bundled runtime, and a PD mismatch seen in a log fixed from the --peer config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridctl.doctor.predict import predict_elastic_builtin
from hybridctl.doctor.run import DoctorOptions, run_doctor, unprobed_host
from hybridctl.rules.cross_file import check_rules
from tests.control.test_doctor_predict import QWEN3_NEXT, apply, cfg_for, ctx_for

LOGS = Path(__file__).resolve().parent / "data" / "logs"


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """A small Qwen3-Next config.json: the bundled runtime plans it on a 0.5 GiB budget."""
    cfg = json.loads(QWEN3_NEXT.read_text())
    cfg.update(hidden_size=128, num_hidden_layers=8, num_experts=8, num_experts_per_tok=2, vocab_size=4096,
               intermediate_size=256, moe_intermediate_size=64, shared_expert_intermediate_size=64)  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_small_elastic_start_split_predicts_a_timeout_and_the_fix_clears_it(tiny_model: Path) -> None:
    cfg = cfg_for(tiny_model, "builtin", 1, enable_elastic_memory_pool=True, max_mamba_cache_size=4,
                  elastic_realloc_timeout_s=0.2, memory_budget_gib=0.5)  # fmt: skip
    plan = ctx_for(cfg).plan(cfg)
    assert plan.pools.max_mamba_cache_size < 2 * plan.pools.slots_per_request
    (f,) = predict_elastic_builtin(cfg, plan, "builtin")
    assert (f.code, f.severity, f.source) == ("ELASTIC_TIMEOUT", "warning", "config")
    assert "0.2 s" in f.cause
    assert [(c.key, c.value) for c in f.changes] == [("memory.enable_elastic_memory_pool", False)]
    fixed = apply(cfg, f.changes)
    assert predict_elastic_builtin(fixed, ctx_for(fixed).plan(fixed), "builtin") == []
    # Room for two requests from the start: no move is needed, nothing is predicted.
    roomy = cfg_for(tiny_model, "builtin", 1, enable_elastic_memory_pool=True,
                    max_mamba_cache_size=4 * plan.pools.slots_per_request, memory_budget_gib=0.5)  # fmt: skip
    assert predict_elastic_builtin(roomy, ctx_for(roomy).plan(roomy), "builtin") == []
    # SGLang's elastic pool is judged from the host (judge.py), not from this split.
    assert predict_elastic_builtin(cfg, plan, "sglang") == []


def test_bundled_runtime_is_not_said_to_lack_the_elastic_pool_or_pd(tiny_model: Path) -> None:
    cfg = cfg_for(tiny_model, "builtin", 1, enable_elastic_memory_pool=True)
    cfg.config.pd.enable_pd_disaggregation = True
    assert [f for f in check_rules(cfg, None) if f.code == "BUILTIN_UNSUPPORTED"] == []


def test_pd_mismatch_in_a_log_is_fixed_from_the_peer(tiny_model: Path, tmp_path: Path) -> None:
    sides = {}
    for name, settings in (("prefill", {}), ("decode", {"mamba": {"state_dtype": "bfloat16"}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(
            f'[server]\nmodel_path = "{tiny_model}"\nengine = "builtin"\n[pd]\nenable_pd_disaggregation = true\n'
        )
        (tmp_path / name / "settings.json").write_text(json.dumps(settings))
        sides[name] = tmp_path / name / "config.toml"
    decode = sides["decode"]

    def log_findings(peer: Path | None):
        with open(LOGS / "runtime_pd_mismatch.log", encoding="utf-8") as lines:
            opts = DoctorOptions(decode, decode.parent / "settings.json", True, log_lines=lines, peer_config=peer)
            report = run_doctor(opts, unprobed_host())
        return [f for f in report.findings if f.source == "log"]

    (with_peer,) = log_findings(sides["prefill"])
    assert with_peer.code == "PD_STATE_MISMATCH"
    assert [(c.file, c.key, c.value) for c in with_peer.changes] == [("settings.json", "mamba.state_dtype", "float32")]
    (alone,) = log_findings(None)
    assert alone.code == "PD_STATE_MISMATCH" and alone.changes == () and "state_dtype" in alone.fix
