"""SPEC_ROLLBACK for real: speculative decoding with the state sandbox off. The doctor predicts it from the
config, the bundled runtime refuses to start with the rollback error, the doctor finds that line in the log,
and after `doctor --fix` the runtime starts and serves speculatively."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.runtime.conftest import REPO_ROOT, start_runtime_server
from tests.runtime.test_doctor_live import doctor, fix, runtime_flags

pytestmark = pytest.mark.slow


def test_spec_without_sandbox_predicted_seen_and_fixed(demo_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f'[server]\nmodel_path = "{demo_model_dir}"\nengine = "builtin"\n[memory]\nmemory_budget_gib = 0.5\n'
        '[speculative]\nspeculative_algorithm = "NGRAM"\nenable_mamba_state_sandbox = false  # no rollback\n',
        encoding="utf-8",
    )
    (tmp_path / "settings.json").write_text("{}\n", encoding="utf-8")

    predicted = [f for f in doctor(config).findings if f.code == "SPEC_ROLLBACK"]
    assert [(f.severity, f.source) for f in predicted] == [("error", "config")]

    log = tmp_path / "failed.log"
    cmd = [sys.executable, "-m", "runtime", "--model-path", str(demo_model_dir), *runtime_flags(config)]
    assert "--disable-mamba-state-sandbox" in cmd
    with open(log, "w", encoding="utf-8") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO_ROOT, timeout=300).returncode
    assert rc == 2, log.read_text()

    seen = [f for f in doctor(config, log).findings if f.source == "log"]
    assert [(f.code, f.severity) for f in seen] == [("SPEC_ROLLBACK", "error")]
    assert seen[0].line is not None and "Speculative decoding state rollback error" in (seen[0].evidence or "")
    assert seen[0].changes == predicted[0].changes  # the log and the config lead to the same edit

    res = fix(config)
    assert res.returncode == 2 and "+enable_mamba_state_sandbox = true" in res.stdout, res.stdout + res.stderr
    assert [f for f in doctor(config).findings if f.code == "SPEC_ROLLBACK"] == []
    assert "--disable-mamba-state-sandbox" not in runtime_flags(config)
    with start_runtime_server(demo_model_dir, *runtime_flags(config), log_dir=tmp_path) as server:
        body = {"text": "one two three one two three one two", "sampling_params": {"temperature": 0,
                "max_new_tokens": 6, "ignore_eos": True}}  # fmt: skip
        out = httpx.post(server.url + "/generate", json=body, timeout=120)
        assert out.status_code == 200, out.text
        meta = out.json()["meta_info"]
        assert meta["completion_tokens"] == 6 and meta["spec_verify_ct"] >= 1  # served speculatively
    assert [f for f in doctor(config, server.log_path).findings if f.source == "log"] == []
