"""The real parser decides: every SGLang command hybridctl emits is parsed by sglang 0.5.23's own
`prepare_server_args` and must land on the ServerArgs fields the config means.

sglang lives in its own venv, never in the test interpreter (its triton breaks transformers' CPU path there).
`.ci/run` creates the venv; the tests marked `sglang` skip where it is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.mapping import ROWS
from hybridctl.launch.pd import pd_plan
from hybridctl.launch.sglang import sglang_command, sglang_translation, to_config_yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SGLANG_VERSION = "0.5.23"

# Runs inside the venv: parse each argv with prepare_server_args; return every ServerArgs field, or the error.
_PROBE = r"""
import contextlib, io, json, sys
from sglang.srt.server_args import prepare_server_args, record_fields

out = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(argv)
    except SystemExit as exc:
        out.append({"error": f"argparse exit {exc.code}: {err.getvalue().strip()[-400:]}"})
        continue
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
        continue
    out.append({"fields": {f.name: getattr(args, f.name) for f in record_fields(type(args))}})
print(json.dumps(out, default=repr))
"""


def sglang_python() -> Path:
    venv = Path(os.environ.get("HYBRIDCTL_SGLANG_VENV", REPO_ROOT / ".venv-sglang"))
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no sglang venv at {venv} (.ci/run creates it; or set HYBRIDCTL_SGLANG_VENV)")
    from hybridctl.launch.sglang import installed_sglang_version

    version = installed_sglang_version(str(python))
    if version != SGLANG_VERSION:
        pytest.skip(f"{venv} has sglang {version}, not {SGLANG_VERSION}")
    return python


def parse_with_sglang(python: Path, argvs: list[list[str]]) -> list[dict[str, object]]:
    """One subprocess for all argvs (importing sglang takes seconds)."""
    proc = subprocess.run(
        [str(python), "-c", _PROBE], input=json.dumps(argvs), capture_output=True, text=True, timeout=300,
        cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The matrix: each case is a config and the ServerArgs fields it must land on (written from the config's
# meaning, not from hybridctl's mapping, so a wrong flag name or value fails here).


def _cfg(config: dict[str, object] | None = None, settings: dict[str, object] | None = None) -> HybridConfig:
    data = {"config": {"server": {"model_path": "/models/qwen3-next"}}, "settings": settings or {}}
    for section, values in (config or {}).items():
        data["config"].setdefault(section, {}).update(values)  # type: ignore[union-attr,attr-defined]
    return HybridConfig.model_validate(data)


CASES: list[tuple[str, HybridConfig, dict[str, object]]] = [
    (
        "defaults",
        _cfg(),
        {
            "model_path": "/models/qwen3-next",
            "host": "127.0.0.1",
            "port": 30000,
            "tp_size": 1,
            "mem_fraction_static": 0.85,
            "mamba_full_memory_ratio": 0.9,
            "page_size": 1,
            "mamba_radix_cache_strategy": "auto",
            "mamba_track_interval": 256,
            "chunked_prefill_size": 8192,
            "schedule_policy": "fcfs",
            "mamba_ssm_dtype": "float32",
            "log_level": "info",
            "disable_radix_cache": False,
            "disable_overlap_schedule": False,
            "enable_unified_memory": False,
            "speculative_algorithm": None,
            "trust_remote_code": False,
            "log_requests": False,
        },
    ),
    (
        "server",
        _cfg(
            {
                "server": {
                    "host": "0.0.0.0",
                    "port": 31000,
                    "tokenizer_path": "/tok",
                    "trust_remote_code": True,
                    "tp_size": 4,
                }
            }
        ),
        {"host": "0.0.0.0", "port": 31000, "tokenizer_path": "/tok", "trust_remote_code": True, "tp_size": 4},
    ),
    (
        "scale-out",
        _cfg(
            {
                "server": {
                    "tp_size": 8,
                    "dp_size": 2,
                    "ep_size": 8,
                    "nnodes": 2,
                    "node_rank": 1,
                    "dist_init_addr": "10.0.0.1:5000",
                }
            }
        ),
        {
            "tp_size": 8,
            "dp_size": 2,
            "ep_size": 8,
            "nnodes": 2,
            "node_rank": 1,
            "dist_init_addr": "10.0.0.1:5000",
        },
    ),
    (
        "memory",
        _cfg(
            {
                "memory": {
                    "mem_fraction_static": 0.7,
                    "mamba_full_memory_ratio": 2.5,
                    "max_mamba_cache_size": 64,
                    "enable_elastic_memory_pool": True,
                }
            }
        ),
        {
            "mem_fraction_static": 0.7,
            "mamba_full_memory_ratio": 2.5,
            "max_mamba_cache_size": 64,
            "enable_unified_memory": True,
        },
    ),
    ("prefix-off", _cfg({"cache": {"enable_prefix_caching": False}}), {"disable_radix_cache": True}),
    (
        "extra-buffer",
        _cfg(
            {
                "cache": {
                    "radix_cache_page_size": 64,
                    "mamba_radix_cache_strategy": "extra_buffer",
                    "mamba_track_interval": 128,
                }
            }
        ),
        {
            "page_size": 64,
            "mamba_radix_cache_strategy": "extra_buffer",
            "mamba_track_interval": 128,
            "disable_overlap_schedule": False,
        },
    ),
    (
        "no-buffer",
        _cfg({"cache": {"mamba_radix_cache_strategy": "no_buffer"}}),
        {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True},
    ),
    (
        "speculative",
        _cfg(
            {
                "speculative": {
                    "speculative_algorithm": "EAGLE3",
                    "speculative_num_steps": 4,
                    "speculative_num_draft_tokens": 8,
                    "speculative_topk": 4,
                    "speculative_draft_model_path": "/models/eagle3",
                }
            }
        ),
        {
            "speculative_algorithm": "EAGLE3",
            "speculative_num_steps": 4,
            "speculative_num_draft_tokens": 8,
            "speculative_eagle_topk": 4,
            "speculative_draft_model_path": "/models/eagle3",
        },
    ),
    (
        "settings",
        _cfg(
            settings={
                "runtime": {
                    "chunked_prefill_size": -1,
                    "max_running_requests": 48,
                    "schedule_policy": "lpm",
                    "disable_radix_cache": True,
                    "enable_torch_compile": True,
                    "torch_compile_max_bs": 16,
                },
                "mamba": {"state_dtype": "bfloat16"},
                "logging": {"level": "debug", "log_requests": True},
            }
        ),
        {
            "chunked_prefill_size": -1,
            "max_running_requests": 48,
            "schedule_policy": "lpm",
            "disable_radix_cache": True,
            "enable_torch_compile": True,
            "torch_compile_max_bs": 16,
            "mamba_ssm_dtype": "bfloat16",
            "log_level": "debug",
            "log_requests": True,
        },
    ),
    (
        "extra-args",
        _cfg(
            {
                "extra_engine_args": {
                    "enable-metrics": True,
                    "kv_cache_dtype": "fp8_e4m3",
                    "--context-length": 32768,
                    "mamba-backend": "flashinfer",
                }
            }
        ),
        {
            "enable_metrics": True,
            "kv_cache_dtype": "fp8_e4m3",
            "context_length": 32768,
            "mamba_backend": "flashinfer",
        },
    ),
]


def test_matrix_covers_every_flag_the_mapping_can_emit() -> None:
    emitted = {flag for _, cfg, _ in CASES for flag in sglang_translation(cfg, SGLANG_VERSION).flags}
    mapped = {
        t.flag for row in ROWS for t in row.sglang
        if t.status == "flag" and t.flag and t.applies_to(SGLANG_VERSION)
        and not row.key.startswith("pd.")
    }  # fmt: skip
    assert mapped <= emitted, f"no matrix case emits {sorted(mapped - emitted)}"


PD_CFG = _cfg({"server": {"tp_size": 2}, "pd": {"enable_pd_disaggregation": True, "prefill_port": 31100,
                                               "decode_port": 31200, "bootstrap_port": 9100}})  # fmt: skip
OLD_NAME_ARGV = sglang_command(_cfg({"cache": {"mamba_radix_cache_strategy": "no_buffer"}}), "0.5.13").argv[3:]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """Every argv of this module through sglang's parser in one subprocess (importing sglang is slow)."""
    python = sglang_python()
    yaml_dir = tmp_path_factory.mktemp("sglang-yaml")
    argvs: dict[str, list[str]] = {}
    for name, cfg, _ in CASES:
        argvs[f"cli:{name}"] = sglang_command(cfg, SGLANG_VERSION).argv[3:]
        text, leftover = to_config_yaml(sglang_translation(cfg, SGLANG_VERSION).flags, SGLANG_VERSION)
        path = yaml_dir / f"{name}.yaml"
        path.write_text(text)
        argvs[f"yaml:{name}"] = ["--config", str(path), *leftover]
    plan = pd_plan(PD_CFG, SGLANG_VERSION)
    argvs["pd:prefill"], argvs["pd:decode"] = plan.prefill.argv[3:], plan.decode.argv[3:]
    argvs["old-name"] = OLD_NAME_ARGV
    results = parse_with_sglang(python, list(argvs.values()))
    return dict(zip(argvs, results, strict=True))


def _fields(result: dict[str, object]) -> dict[str, object]:
    assert "error" not in result, result.get("error")
    fields = result["fields"]
    assert isinstance(fields, dict)
    return fields


@pytest.mark.sglang
def test_every_command_parses_with_sglang_and_lands_on_the_right_fields(
    parsed: dict[str, dict[str, object]],
) -> None:
    for name, _, expected in CASES:
        fields = _fields(parsed[f"cli:{name}"])
        for field, value in expected.items():
            assert fields[field] == value, f"{name}: {field} = {fields[field]!r}, expected {value!r}"


@pytest.mark.sglang
def test_config_yaml_parses_to_the_same_server_args_as_the_command_line(
    parsed: dict[str, dict[str, object]],
) -> None:
    for name, _, _ in CASES:
        assert _fields(parsed[f"yaml:{name}"]) == _fields(parsed[f"cli:{name}"]), name


@pytest.mark.sglang
def test_pd_worker_commands_parse_with_their_roles(parsed: dict[str, dict[str, object]]) -> None:
    prefill, decode = _fields(parsed["pd:prefill"]), _fields(parsed["pd:decode"])
    assert (prefill["disaggregation_mode"], prefill["port"]) == ("prefill", 31100)
    assert prefill["disaggregation_bootstrap_port"] == 9100
    assert (decode["disaggregation_mode"], decode["port"], decode["base_gpu_id"]) == ("decode", 31200, 2)


@pytest.mark.sglang
def test_the_old_strategy_flag_is_rejected_by_0_5_23_which_is_why_it_is_version_gated(
    parsed: dict[str, dict[str, object]],
) -> None:
    assert "--mamba-scheduler-strategy" in OLD_NAME_ARGV
    result = parsed["old-name"]
    assert "error" in result and "mamba-scheduler-strategy" in str(result["error"])


@pytest.mark.sglang
def test_regen_script_reproduces_the_shipped_flag_table() -> None:
    from hybridshared.flags.engine_flags import parse_flag_table, sglang_flags

    python = sglang_python()
    proc = subprocess.run(
        [str(python), str(REPO_ROOT / "scripts" / "regen_sglang_flags.py"), "--stdout"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]

    regenerated = parse_flag_table(proc.stdout)
    shipped = sglang_flags(SGLANG_VERSION)
    assert set(regenerated) == set(shipped)
    for name in shipped:
        # Choices compare as sets: dynamic ones (sampling backends from plugins) come in registration order.
        a, b = regenerated[name], shipped[name]
        assert (a.dest, a.type, a.default, a.action, a.aliases, sorted(a.choices)) == (
            b.dest, b.type, b.default, b.action, b.aliases, sorted(b.choices)
        ), name  # fmt: skip


_ROUTER_PROBE = r"""
import json, sys
from sglang_router.launch_router import parse_router_args

args = parse_router_args(json.load(sys.stdin))
print(json.dumps({"pd": args.pd_disaggregation, "prefill": args.prefill_urls, "decode": args.decode_urls,
                  "host": args.host, "port": args.port}))
"""


@pytest.mark.sglang
def test_pd_router_command_parses_with_sglang_router() -> None:
    python = sglang_python()
    probe = subprocess.run([str(python), "-c", "import sglang_router"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip("sglang-router is not installed in the sglang venv (.ci/run installs it)")
    cfg = _cfg({"server": {"host": "0.0.0.0", "port": 8000},
                "pd": {"enable_pd_disaggregation": True, "bootstrap_port": 9100}})  # fmt: skip
    router = pd_plan(cfg, SGLANG_VERSION).router.argv
    assert router[1:3] == ["-m", "sglang_router.launch_router"]
    proc = subprocess.run(
        [str(python), "-c", _ROUTER_PROBE],
        input=json.dumps(router[3:]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed == {"pd": True, "prefill": [["http://127.0.0.1:30100", 9100]],
                      "decode": ["http://127.0.0.1:30200"], "host": "0.0.0.0", "port": 8000}  # fmt: skip
