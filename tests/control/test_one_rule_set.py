"""One rule set: every refusal of `launch --dry-run` and of the bundled runtime's start-up checks is reported by
`validate` first, and a fuzz over both files finds no config that validate passes and launch or the runtime refuses.

The runtime's checks run for real: `hybridshared.flags.runtime_parser.parse_args` on the printed command's flags, then
`runtime.preflight.preflight` (what the engine refuses before loading weights). Neither imports torch.
"""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridctl.cli import app
from hybridctl.launch.plan import auto_engine_here, make_launch_plan
from hybridctl.launch.translate import LaunchError, engine_findings
from hybridctl.rules.check import check_files
from hybridshared.flags.runtime_parser import parse_args
from runtime.preflight import PreflightError, preflight

runner = CliRunner()
TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "models" / "qwen3-next-80b-a3b.json"


def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(TEMPLATE.read_text())
    return model


def write(tmp_path: Path, config: str, settings: str = "{}") -> tuple[Path, Path]:
    cpath, spath = tmp_path / "config.toml", tmp_path / "settings.json"
    cpath.write_text(config)
    spath.write_text(settings)
    return cpath, spath


def runtime_refusal(argv: list[str]) -> str | None:
    """Why the bundled runtime would refuse this command line (parse + preflight), or None."""
    try:
        args = parse_args(argv[3:])  # python -m runtime ...
    except SystemExit as exc:
        return f"argument error (exit {exc.code})"
    try:
        preflight(args)
    except PreflightError as exc:
        return str(exc)
    return None


def launch_refusal(cpath: Path, spath: Path) -> str | None:
    """Why `launch --dry-run` (then the runtime, for builtin) would refuse, judged the way launch judges it."""
    report = check_files(cpath, spath, auto_engine=auto_engine_here())
    if report.config is None:
        return "config does not load"
    try:
        plan = make_launch_plan(report.config, allow_ignored=True)
    except LaunchError as exc:
        return str(exc)
    if plan.engine == "builtin":
        for command in plan.commands:
            if command.argv[1:3] == ["-m", "runtime"]:
                why = runtime_refusal(command.argv)
                if why:
                    return why
    return None


# Every refusal of launch's builders and of the runtime that a config can reach, and the code validate gives it.
# (Refusals of values the schema already rejects — ports outside 1..65535, negative sizes — are schema errors.)
REFUSALS = [
    ("empty model_path", "", "MODEL_PATH_MISSING", "builtin"),
    ("model_path does not exist", 'model_path = "/nonexistent/model"', "MODEL_PATH_NOT_FOUND", "sglang"),
    ("hub id on builtin", 'model_path = "Qwen/Qwen3-Next-80B-A3B-Instruct"', "MODEL_PATH_NOT_FOUND", "builtin"),
    (
        "node_rank >= nnodes",
        '{model}\nnnodes = 2\nnode_rank = 2\ndist_init_addr = "10.0.0.1:5000"',
        "MULTINODE",
        "sglang",
    ),
    ("nnodes > 1 without dist_init_addr", "{model}\nnnodes = 2", "MULTINODE", "sglang"),
    ("absurd host", '{model}\nhost = "' + "a" * 100_000 + '"', "HOST_INVALID", "builtin"),
    ("empty host", '{model}\nhost = ""', "HOST_INVALID", "builtin"),
    (
        "elastic + speculative on builtin",
        '{model}\n[memory]\nenable_elastic_memory_pool = true\n[speculative]\nspeculative_algorithm = "NGRAM"',
        "BUILTIN_UNSUPPORTED",
        "builtin",
    ),
    (
        "draft tree on builtin",
        '{model}\n[speculative]\nspeculative_algorithm = "NGRAM"\nspeculative_topk = 4',
        "BUILTIN_UNSUPPORTED",
        "builtin",
    ),
    (
        "draft tree on sglang",
        '{model}\n[speculative]\nspeculative_algorithm = "EAGLE"\nspeculative_topk = 4',
        "SPEC_ROLLBACK",
        "sglang",
    ),
    (
        "sandbox off under speculation",
        '{model}\n[speculative]\nspeculative_algorithm = "NGRAM"\nenable_mamba_state_sandbox = false',
        "SPEC_ROLLBACK",
        "builtin",
    ),
    (
        "STANDALONE without a draft model",
        '{model}\n[speculative]\nspeculative_algorithm = "STANDALONE"',
        "SPEC_DRAFT_MODEL",
        "builtin",
    ),
    ("EAGLE3 on builtin", '{model}\n[speculative]\nspeculative_algorithm = "EAGLE3"', "BUILTIN_UNSUPPORTED", "builtin"),
    (
        "extra_buffer_lazy on builtin",
        '{model}\n[cache]\nmamba_radix_cache_strategy = "extra_buffer_lazy"',
        "BUILTIN_UNSUPPORTED",
        "builtin",
    ),
    ("tp > 1 on builtin", "{model}\ntp_size = 2", "BUILTIN_UNSUPPORTED", "builtin"),
    (
        "track interval not a page multiple, cache off",
        "{model}\n[cache]\nenable_prefix_caching = false\nradix_cache_page_size = 16\nmamba_track_interval = 100",
        "BUILTIN_UNSUPPORTED",
        "builtin",
    ),
    (
        "no_buffer with pages",
        '{model}\n[cache]\nradix_cache_page_size = 16\nmamba_radix_cache_strategy = "no_buffer"',
        "PREFIX_CACHE_MISS",
        "builtin",
    ),
    ("unknown extra flag", "{model}\n[extra_engine_args]\nno-such-flag = 1", "UNKNOWN_ENGINE_FLAG", "sglang"),
    ("PD ports collide", "{model}\nport = 30100\n[pd]\nenable_pd_disaggregation = true", "PORT_CONFLICT", "builtin"),
    ("extra flag a key sets", "{model}\n[extra_engine_args]\npage-size = 16", "ENGINE_FLAG_SHADOWS_KEY", "sglang"),
    (
        "PD role flag in extra args",
        '{model}\n[pd]\nenable_pd_disaggregation = true\n[extra_engine_args]\ndisaggregation-mode = "prefill"',
        "ENGINE_FLAG_SHADOWS_KEY",
        "sglang",
    ),
    (
        "secret in extra args",
        '{model}\n[extra_engine_args]\napi-key = "hunter2-but-longer"',
        "LITERAL_SECRET",
        "builtin",
    ),
    ("switch given a number", "{model}\n[extra_engine_args]\nenable-metrics = 3", "ENGINE_FLAG_VALUE", "sglang"),
    ("flag value outside its choices", '{model}\n[extra_engine_args]\ndtype = "int3"', "ENGINE_FLAG_VALUE", "builtin"),
    (
        "runtime value out of range",
        "{model}\n[extra_engine_args]\nmax-request-body-bytes = 10",
        "BUILTIN_REFUSES",
        "builtin",
    ),  # fmt: skip
    (
        "step-token cap of 0",
        "{model}\n[extra_engine_args]\ndecoding-step-tokens = 0",
        "BUILTIN_REFUSES",
        "builtin",
    ),  # fmt: skip
    (
        "mixed chunk on and off",
        "{model}\n[extra_engine_args]\nenable-mixed-chunk = true\ndisable-mixed-chunk = true",
        "BUILTIN_REFUSES",
        "builtin",
    ),  # fmt: skip
    ("runtime type check", "{model}\n[extra_engine_args]\nnum-threads = 0", "BUILTIN_REFUSES", "builtin"),
    (
        "speculative algorithm the runtime lacks",
        '{model}\n[speculative]\nspeculative_algorithm = "EAGLE3"',
        "BUILTIN_UNSUPPORTED",
        "builtin",
    ),
    (
        "engine process with PD on builtin",
        "{model}\n[pd]\nenable_pd_disaggregation = true\n[extra_engine_args]\nengine-process = true",
        "BUILTIN_UNSUPPORTED",
        "builtin",
    ),
    ("schedule policy the runtime lacks", "{model}", "BUILTIN_UNSUPPORTED", "builtin:lof"),
    ("chunked prefill 0 on builtin", "{model}", "BUILTIN_UNSUPPORTED", "builtin:chunk0"),
]

# Where launch (dry run) and the runtime refuse, by a fragment of each message, and the REFUSALS case (or the
# reason no config can reach it) that covers it. A new refusal without an entry here fails the test below.
REFUSAL_SITES = {
    "hybridshared/flags/runtime_parser.py": {
        "--tp-size": "tp > 1 on builtin",
        "--schedule-policy": "schedule policy the runtime lacks",
        "--chunked-prefill-size": "chunked prefill 0 on builtin",
        "--port": "schema: server.port is 1..65535",
        "--disaggregation-bootstrap-port": "schema: pd.bootstrap_port is 1..65535",
        "is an SGLang flag the bundled runtime does not implement": "unknown extra flag",
        "--max-request-body-bytes": "runtime value out of range",
        "--decoding-step-tokens {ns.decoding_step_tokens}": "step-token cap of 0",
        "--enable-mixed-chunk and --disable-mixed-chunk": "mixed chunk on and off",
        "--api-key and --api-key-env": "unreachable: launch never passes --api-key (a literal key is LITERAL_SECRET)",
        "give the NAME of an environment variable": "schema: api.api_key_env is a variable name",
        "that environment variable is unset or empty": "unreachable: the environment at launch, not the files",
        "--api-key: the key holds non-ASCII": "unreachable: the key comes from the environment at launch",
        "--grammar-backend {ns.grammar_backend}": "unreachable: launch checks extra_engine_args' choices first",
    },
    "runtime/preflight.py": {
        "no such directory": "model_path does not exist",
        "config.json not found": "model_path does not exist",
        "cannot be looked up": "model_path does not exist",
        "enable_elastic_memory_pool with speculative decoding": "elastic + speculative on builtin",
        "must be a positive multiple of page_size": "track interval not a page multiple, cache off",
        "extra_buffer_lazy needs the overlap schedule": "extra_buffer_lazy on builtin",
        "--engine-process with --disaggregation-mode": "engine process with PD on builtin",
        "str(exc)": "no_buffer with pages",
    },
    "runtime/core/speculative_config.py": {
        "--speculative-algorithm {algorithm}": "speculative algorithm the runtime lacks",
        "Speculative decoding state rollback error": "sandbox off under speculation",
        "--speculative-eagle-topk": "draft tree on builtin",
        "--speculative-num-steps": "schema: speculative_num_steps >= 1",
        "STANDALONE needs a draft model": "STANDALONE without a draft model",
    },
    "hybridctl/launch/command.py": {
        "model_path is empty": "empty model_path",
        "is not a flag of": "unknown extra flag",
        "would put a secret": "secret in extra args",
        "is already set from": "extra flag a key sets",
        "is not one of": "flag value outside its choices",
        "is a switch of": "switch given a number",
    },
    "hybridctl/launch/sglang.py": {"config.toml [server] {message}": "nnodes > 1 without dist_init_addr"},
    "hybridctl/launch/pd.py": {
        "enable_pd_disaggregation is false": "unreachable: pd_plan is only called with [pd] on",
        "PD needs four different ports": "PD ports collide",
        "which PD sets per server": "PD role flag in extra args",
    },
    "hybridctl/launch/translate.py": {
        "would silently ignore": "IGNORED_BY_ENGINE: a warning; launch refuses it unless --allow-ignored (test below)",
    },
    "hybridctl/launch/plan.py": {"unknown engine": "schema: server.engine is auto, sglang or builtin"},
}
_REFUSERS = {"error", "PreflightError", "SpecConfigError", "LaunchError"}


def _refusal_messages(path: Path) -> list[str]:
    import ast

    text = path.read_text()
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in _REFUSERS:
                out.append(ast.get_source_segment(text, node.args[0]) or "")
    return out


def test_every_refusal_site_is_covered() -> None:
    repo = Path(__file__).resolve().parents[2]
    cases = {r[0] for r in REFUSALS}
    for file, known in REFUSAL_SITES.items():
        for message in _refusal_messages(repo / file):
            covered = [case for fragment, case in known.items() if fragment in message]
            assert covered, f"{file}: a refusal no case covers; add it to REFUSALS and REFUSAL_SITES: {message}"
            for case in covered:
                assert case in cases or case.split(":")[0] in ("schema", "unreachable", "IGNORED_BY_ENGINE"), case


@pytest.mark.parametrize(("config", "code", "engine"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_validate_reports_every_launch_and_runtime_refusal(tmp_path: Path, config: str, code: str, engine: str) -> None:
    model = model_dir(tmp_path)
    engine, _, variant = engine.partition(":")
    body = config.replace("{model}", f'model_path = "{model}"')
    text = f'[server]\nengine = "{engine}"\n' + body if not body.startswith("[") else body
    runtime = {"lof": {"schedule_policy": "lof"}, "chunk0": {"chunked_prefill_size": 0}}.get(variant, {})
    settings = json.dumps({"runtime": runtime})
    cpath, spath = write(tmp_path, text, settings)
    report = check_files(cpath, spath, auto_engine=auto_engine_here())
    codes = [f.code for f in report.errors]
    assert code in codes, f"validate misses a refusal: {codes}"
    found = next(f for f in report.errors if f.code == code)
    assert found.key and found.fix  # which key, and what to do
    # ... and the refusal is real: with validate's errors ignored, launch or the runtime refuses too.
    result = runner.invoke(app, ["launch", str(cpath), "--dry-run"])
    assert result.exit_code == 2


def test_keys_the_engine_would_ignore_are_reported_by_validate(tmp_path: Path) -> None:
    model = model_dir(tmp_path)
    cpath, spath = write(
        tmp_path, f'[server]\nengine = "sglang"\nmodel_path = "{model}"\n[cache]\nenable_dual_lru_eviction = false\n'
    )
    report = check_files(cpath, spath, engine_notes=engine_findings)
    [ignored] = [f for f in report.warnings if f.code == "IGNORED_BY_ENGINE"]
    assert ignored.key == "cache.enable_dual_lru_eviction" and ignored.line == 5
    with pytest.raises(LaunchError, match="enable_dual_lru_eviction"):
        make_launch_plan(report.config)  # what launch does without --allow-ignored


def test_validate_says_where_a_huge_host_is_without_printing_it(tmp_path: Path) -> None:
    model = model_dir(tmp_path)
    cpath, spath = write(tmp_path, f'[server]\nmodel_path = "{model}"\nhost = "{"a" * 100_000}"\n')
    result = runner.invoke(app, ["validate", str(cpath), "--json"])
    assert result.exit_code == 2
    [finding] = [f for f in json.loads(result.output)["findings"] if f["code"] == "HOST_INVALID"]
    assert finding["line"] == 3 and len(finding["message"]) < 400


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.com"])
def test_non_loopback_host_warns_in_validate_and_doctor(tmp_path: Path, host: str) -> None:
    model = model_dir(tmp_path)
    cpath, spath = write(tmp_path, f'[server]\nengine = "sglang"\nmodel_path = "{model}"\nhost = "{host}"\n')
    report = check_files(cpath, spath)
    assert [f.code for f in report.warnings] == ["HOST_EXPOSED"] and not report.errors
    doctor = runner.invoke(app, ["doctor", "--config", str(cpath), "--no-host", "--json", "--gpu-mem-gib", "80"])
    assert "HOST_EXPOSED" in doctor.output
    for loopback in ("127.0.0.1", "localhost", "::1"):
        cpath.write_text(cpath.read_text().replace(f'host = "{host}"', f'host = "{loopback}"'))
        assert check_files(cpath, spath).findings == []
        host = loopback


# --- fuzz -----------------------------------------------------------------------------------------------------

_VALUES: dict[str, list[object]] = {
    "server.engine": ["builtin", "sglang", "auto"],
    "server.host": ["127.0.0.1", "0.0.0.0", "", "::1", "bad host!", "a" * 300, "localhost"],
    "server.port": [30000, 8080, 0, 70000, "30000"],
    "server.tp_size": [1, 2, 0],
    "server.nnodes": [1, 2],
    "server.node_rank": [0, 1, 2],
    "server.dist_init_addr": ["10.0.0.1:5000", None],
    "server.model_path": ["{model}", "", "/nonexistent", "Org/Name", "{model}/config.json"],
    "memory.mem_fraction_static": [0.85, 0.5, 1.5],
    "memory.mamba_full_memory_ratio": [0.9, 0.35, 4.0],
    "memory.enable_elastic_memory_pool": [True, False],
    "memory.max_mamba_cache_size": [None, 64],
    "cache.enable_prefix_caching": [True, False],
    "cache.radix_cache_page_size": [1, 16, 64],
    "cache.mamba_radix_cache_strategy": ["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy", "nope"],
    "cache.mamba_track_interval": [256, 100, 8],
    "speculative.speculative_algorithm": ["none", "EAGLE", "EAGLE3", "NEXTN", "NGRAM", "STANDALONE"],
    "speculative.speculative_num_steps": [3, 1, 7],
    "speculative.speculative_num_draft_tokens": [4, 8, 2],
    "speculative.speculative_topk": [1, 4],
    "speculative.speculative_draft_model_path": [None, "{model}", "/nonexistent/draft", "Org/Draft"],
    "server.tokenizer_path": [None, "{model}", "/nonexistent/tok"],
    "speculative.enable_mamba_state_sandbox": [True, False],
    "pd.enable_pd_disaggregation": [False, True],
    "pd.mamba_state_transfer_mode": ["atomic", "layerwise"],
    "pd.prefill_port": [30100, 30000],
    "extra_engine_args.context-length": [None, 4096],
    "extra_engine_args.no-such-flag": [None, 1],
    "extra_engine_args.mamba-track-interval": [None, 128],
    "extra_engine_args.enable-metrics": [None, True, 3],
    "extra_engine_args.api-key": [None, "hunter2-but-longer"],
    "extra_engine_args.disaggregation-mode": [None, "prefill"],
    "extra_engine_args.max-total-tokens": [None, 4096, 1],
    "runtime.chunked_prefill_size": [8192, -1, 0, -5],
    "runtime.max_running_requests": [None, 64, 0],
    "runtime.schedule_policy": ["fcfs", "lpm", "lof"],
    "runtime.disable_radix_cache": [False, True],
    "mamba.state_dtype": ["float32", "bfloat16", "int8"],
    "mamba.state_snapshot_on_match": [True, False],
    "logging.level": ["info", "debug"],
    "logging.log_mamba_state_stats": [False, True],
    "api.base_url": [None, "https://example.com/v1", "https://x.net/api?api_key=abc123"],
}
_SETTINGS_SECTIONS = ("runtime", "mamba", "logging", "api")


def _toml_value(value: object) -> str:
    return json.dumps(value) if not isinstance(value, bool) else ("true" if value else "false")


def _render(choice: dict[str, object], model: Path) -> tuple[str, str]:
    tables: dict[str, dict[str, object]] = {}
    settings: dict[str, dict[str, object]] = {}
    for dotted, value in choice.items():
        if value is None:
            continue
        if isinstance(value, str):
            value = value.replace("{model}", str(model))
        section, key = dotted.split(".", 1)
        (settings if section in _SETTINGS_SECTIONS else tables).setdefault(section, {})[key] = value
    toml = "".join(
        f"[{section}]\n" + "".join(f'"{k}" = {_toml_value(v)}\n' for k, v in keys.items())
        for section, keys in tables.items()
    )
    return toml, json.dumps(settings)


def test_config_fuzz_validate_passes_only_what_launch_and_runtime_accept(tmp_path: Path) -> None:
    rng = random.Random(15)
    model = model_dir(tmp_path)
    keys = list(_VALUES)
    passed = 0
    for i in range(520):
        choice = {k: rng.choice(_VALUES[k]) for k in rng.sample(keys, rng.randint(1, 10))}
        choice.setdefault("server.model_path", "{model}")
        toml, settings = _render(choice, model)
        case = tmp_path / f"case{i}"
        case.mkdir()
        cpath, spath = write(case, toml, settings)
        result = runner.invoke(app, ["validate", str(cpath), str(spath)])
        assert result.exception is None or isinstance(result.exception, SystemExit), (choice, result.exception)
        if result.exit_code != 0:
            continue
        passed += 1
        why = launch_refusal(cpath, spath)
        assert why is None, f"validate passed but launch/runtime refuses: {why}\n{toml}\n{settings}"
        dry = runner.invoke(app, ["launch", str(cpath), "--dry-run", "--allow-ignored"])
        assert dry.exit_code == 0, (toml, settings, dry.output)
        shlex.split(dry.output.strip().splitlines()[-1])  # the last line is a shell command
    assert passed >= 50  # the fuzz reaches valid configs, not only errors


def test_a_server_key_quiets_the_exposure_warning_only_where_the_engine_requires_it(tmp_path: Path) -> None:
    model = model_dir(tmp_path)
    keyed = f'model_path = "{model}"\nhost = "0.0.0.0"\napi_key_env = "HYBRID_SERVER_KEY"\n'
    cpath, spath = write(tmp_path, f'[server]\nengine = "builtin"\n{keyed}')
    assert "HOST_EXPOSED" not in [f.code for f in check_files(cpath, spath).findings]
    # SGLang is started without a key (it takes one only as a value): still exposed, and the key is ignored.
    cpath.write_text(f'[server]\nengine = "sglang"\n{keyed}')
    codes = [f["code"] for f in json.loads(runner.invoke(app, ["validate", str(cpath), "--json"]).output)["findings"]]
    assert "HOST_EXPOSED" in codes and "IGNORED_BY_ENGINE" in codes
