"""Each cross-file / engine rule fires on a file that breaks it, at its key and line; never on defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_files import with_model

from hybridctl.config.schema import HybridConfig
from hybridctl.rules.check import check_files
from hybridctl.rules.cross_file import check_rules

# (id, config.toml, settings.json, code, key, severity)
CASES = [
    (
        "radix-off-in-settings",
        "[cache]\nenable_prefix_caching = true\n",
        '{"runtime": {"disable_radix_cache": true}}',
        "PREFIX_CACHE_MISS",
        "runtime.disable_radix_cache",
        "warning",
    ),
    (
        "page-size-no-buffer",
        '[cache]\nradix_cache_page_size = 16\nmamba_radix_cache_strategy = "no_buffer"\n',
        "{}",
        "PREFIX_CACHE_MISS",
        "cache.radix_cache_page_size",
        "error",
    ),
    (
        "page-size-auto",
        "[cache]\nradix_cache_page_size = 16\n",
        "{}",
        "PREFIX_CACHE_MISS",
        "cache.mamba_radix_cache_strategy",
        "warning",
    ),
    (
        "snapshot-off",
        "",
        '{"mamba": {"state_snapshot_on_match": false}}',
        "PREFIX_CACHE_MISS",
        "mamba.state_snapshot_on_match",
        "warning",
    ),
    (
        "track-interval-page",
        '[cache]\nradix_cache_page_size = 64\nmamba_radix_cache_strategy = "extra_buffer"\n'
        "mamba_track_interval = 100\n",
        "{}",
        "PAGE_SIZE_MISMATCH",
        "cache.mamba_track_interval",
        "error",
    ),
    (
        "spec-no-sandbox",
        '[speculative]\nspeculative_algorithm = "NEXTN"\nenable_mamba_state_sandbox = false\n',
        "{}",
        "SPEC_ROLLBACK",
        "speculative.enable_mamba_state_sandbox",
        "error",
    ),
    (
        "spec-track-interval",
        '[cache]\nmamba_radix_cache_strategy = "extra_buffer"\nmamba_track_interval = 2\n'
        '[speculative]\nspeculative_algorithm = "EAGLE"\n',
        "{}",
        "SPEC_ROLLBACK",
        "cache.mamba_track_interval",
        "error",
    ),
    (
        "spec-topk1-draft",
        '[speculative]\nspeculative_algorithm = "EAGLE"\nspeculative_num_steps = 3\nspeculative_num_draft_tokens = 8\n',
        "{}",
        "SPEC_ROLLBACK",
        "speculative.speculative_num_draft_tokens",
        "warning",
    ),
    (
        "standalone-no-draft",
        '[speculative]\nspeculative_algorithm = "STANDALONE"\n',
        "{}",
        "SPEC_DRAFT_MODEL",
        "speculative.speculative_draft_model_path",
        "error",
    ),
    (
        "pd-layerwise",
        '[pd]\nenable_pd_disaggregation = true\nmamba_state_transfer_mode = "layerwise"\n',
        "{}",
        "PD_STATE_MISMATCH",
        "pd.mamba_state_transfer_mode",
        "error",
    ),
    (
        "pd-lazy",
        '[cache]\nmamba_radix_cache_strategy = "extra_buffer_lazy"\n[pd]\nenable_pd_disaggregation = true\n',
        "{}",
        "PD_STRATEGY_UNSUPPORTED",
        "cache.mamba_radix_cache_strategy",
        "error",
    ),
    (
        "pd-ports",
        "[pd]\nenable_pd_disaggregation = true\ndecode_port = 30100\n",
        "{}",
        "PORT_CONFLICT",
        "pd.decode_port",
        "error",
    ),
    (
        "elastic-ngram",
        '[memory]\nenable_elastic_memory_pool = true\n[speculative]\nspeculative_algorithm = "NGRAM"\n',
        "{}",
        "ELASTIC_SPEC_UNSUPPORTED",
        "speculative.speculative_algorithm",
        "error",
    ),
    (
        "elastic-topk",
        '[memory]\nenable_elastic_memory_pool = true\n[speculative]\nspeculative_algorithm = "EAGLE"\n'
        "speculative_topk = 4\nspeculative_num_draft_tokens = 8\n",
        "{}",
        "ELASTIC_SPEC_UNSUPPORTED",
        "speculative.speculative_topk",
        "error",
    ),
    (
        "elastic-pd-spec",
        '[memory]\nenable_elastic_memory_pool = true\n[speculative]\nspeculative_algorithm = "EAGLE"\n'
        "[pd]\nenable_pd_disaggregation = true\n",
        "{}",
        "ELASTIC_PD_SPEC",
        "memory.enable_elastic_memory_pool",
        "error",
    ),
    (
        "builtin-policy",
        '[server]\nengine = "builtin"\n',
        '{"runtime": {"schedule_policy": "dfs-weight"}}',
        "BUILTIN_UNSUPPORTED",
        "runtime.schedule_policy",
        "error",
    ),
    (
        "builtin-spec-eagle3",
        '[server]\nengine = "builtin"\n[speculative]\nspeculative_algorithm = "EAGLE3"\n',
        "{}",
        "BUILTIN_UNSUPPORTED",
        "speculative.speculative_algorithm",
        "error",
    ),
    (
        "builtin-spec-topk",
        '[server]\nengine = "builtin"\n[speculative]\nspeculative_algorithm = "NGRAM"\nspeculative_topk = 2\n',
        "{}",
        "BUILTIN_UNSUPPORTED",
        "speculative.speculative_topk",
        "error",
    ),
    (
        "builtin-tp",
        '[server]\nengine = "builtin"\ntp_size = 2\n',
        "{}",
        "BUILTIN_UNSUPPORTED",
        "server.tp_size",
        "error",
    ),
    (
        "builtin-lazy",
        '[server]\nengine = "builtin"\n[cache]\nmamba_radix_cache_strategy = "extra_buffer_lazy"\n',
        "{}",
        "BUILTIN_UNSUPPORTED",
        "cache.mamba_radix_cache_strategy",
        "error",
    ),
    (
        "unknown-flag",
        '[extra_engine_args]\nmamba-backnd = "triton"\n',
        "{}",
        "UNKNOWN_ENGINE_FLAG",
        "extra_engine_args.mamba-backnd",
        "error",
    ),
    (
        "renamed-flag",
        '[extra_engine_args]\nmamba-scheduler-strategy = "extra_buffer"\n',
        "{}",
        "UNKNOWN_ENGINE_FLAG",
        "extra_engine_args.mamba-scheduler-strategy",
        "error",
    ),
    (
        "flag-choice",
        '[extra_engine_args]\nmamba-backend = "cuda"\n',
        "{}",
        "ENGINE_FLAG_VALUE",
        "extra_engine_args.mamba-backend",
        "error",
    ),
    (
        "flag-nan-value",
        "[extra_engine_args]\nmax-prefill-tokens = nan\n",
        "{}",
        "WRONG_TYPE",
        "extra_engine_args.max-prefill-tokens",
        "error",
    ),
    (
        "flag-inf-value",
        "[extra_engine_args]\nmem-fraction-static = -inf\n",
        "{}",
        "WRONG_TYPE",
        "extra_engine_args.mem-fraction-static",
        "error",
    ),
    (
        "flag-switch-value",
        "[extra_engine_args]\nenable-metrics = 3\n",
        "{}",
        "ENGINE_FLAG_VALUE",
        "extra_engine_args.enable-metrics",
        "error",
    ),
    (
        "flag-shadows-key",
        "[extra_engine_args]\nmamba-track-interval = 128\n",
        "{}",
        "ENGINE_FLAG_SHADOWS_KEY",
        "extra_engine_args.mamba-track-interval",
        "error",  # launch refuses a flag that a config key already sets
    ),
    (
        "secret-flag",
        '[extra_engine_args]\napi-key = "hunter2-but-longer"\n',
        "{}",
        "LITERAL_SECRET",
        "extra_engine_args.api-key",
        "error",
    ),
    (
        "secret-url",
        "",
        '{"api": {"base_url": "https://bob:s3cret@gateway.example/v1"}}',
        "LITERAL_SECRET",
        "api.base_url",
        "error",
    ),
]


def write(tmp_path: Path, config: str, settings: str) -> tuple[Path, Path]:
    cpath, spath = tmp_path / "config.toml", tmp_path / "settings.json"
    cpath.write_text(with_model(tmp_path, config), encoding="utf-8")
    spath.write_text(settings, encoding="utf-8")
    return cpath, spath


@pytest.mark.parametrize(
    ("config", "settings", "code", "key", "severity"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule_fires(tmp_path: Path, config: str, settings: str, code: str, key: str, severity: str) -> None:
    cpath, spath = write(tmp_path, config, settings)
    report = check_files(cpath, spath)
    hits = [f for f in report.findings if f.code == code and f.key == key]
    assert hits, [str(f) for f in report.findings]
    hit = hits[0]
    assert hit.severity == severity
    assert hit.fix, "every rule finding says how to fix it"
    expected_file = spath if key.split(".")[0] in ("runtime", "mamba", "logging", "api") else cpath
    assert hit.file == str(expected_file)
    text = (cpath if hit.file == str(cpath) else spath).read_text().splitlines()
    if key.split(".")[-1] in (config + settings):
        assert hit.line is not None and key.split(".")[-1] in text[hit.line - 1]
    assert report.exit_code() == (2 if report.errors else 0)


def test_defaults_have_no_rule_findings(tmp_path) -> None:
    # The defaults plus the one key without a default (what to serve) raise nothing.
    (tmp_path / "config.json").write_text("{}")
    cfg = HybridConfig()
    assert [f.code for f in check_rules(cfg)] == ["MODEL_PATH_MISSING"]
    cfg.config.server.model_path = str(tmp_path)
    assert check_rules(cfg) == []


def test_rule_findings_name_the_fix_exactly() -> None:
    cfg = HybridConfig()
    cfg.config.speculative.speculative_algorithm = "EAGLE"
    cfg.config.speculative.enable_mamba_state_sandbox = False
    [finding] = [f for f in check_rules(cfg) if f.code == "SPEC_ROLLBACK"]
    assert finding.fix == "set enable_mamba_state_sandbox = true in [speculative] of config.toml"
    assert finding.file == "config.toml"


def test_unknown_engine_version_falls_back_with_warning(tmp_path: Path) -> None:
    cpath, spath = write(tmp_path, '[extra_engine_args]\nmamba-backend = "triton"\n', "{}")
    report = check_files(cpath, spath, engine_version="0.9.1")
    assert [f.code for f in report.findings] == ["ENGINE_VERSION_UNKNOWN"]
    assert check_files(cpath, spath, engine_version="0.5.23").findings == []


def test_builtin_engine_checks_the_runtime_flags(tmp_path: Path) -> None:
    """--num-threads is the runtime's own flag (not SGLang's); --mamba-backend is SGLang's only."""
    config = '[server]\nengine = "builtin"\n[extra_engine_args]\nnum-threads = 2\nmamba-backend = "triton"\n'
    cpath, spath = write(tmp_path, config, "{}")
    found = [(f.code, f.key) for f in check_files(cpath, spath).findings if "ENGINE_FLAG" in f.code]
    assert found == [("UNKNOWN_ENGINE_FLAG", "extra_engine_args.mamba-backend")]


def test_builtin_engine_runs_chain_speculative_decoding(tmp_path: Path) -> None:
    """NGRAM / STANDALONE / NEXTN with topk 1 are implemented by the runtime: nothing BUILTIN_UNSUPPORTED."""
    for algorithm in ("NGRAM", "NEXTN", "EAGLE"):
        config = f'[server]\nengine = "builtin"\n[speculative]\nspeculative_algorithm = "{algorithm}"\n'
        cpath, spath = write(tmp_path, config, "{}")
        assert not [f for f in check_files(cpath, spath).findings if f.code == "BUILTIN_UNSUPPORTED"]


def test_shadowing_uses_the_launch_mapping(tmp_path: Path) -> None:
    """--page-size is set by [cache] radix_cache_page_size: the names differ, the mapping table knows."""
    cpath, spath = write(tmp_path, "[extra_engine_args]\npage-size = 16\n", "{}")
    [hit] = [f for f in check_files(cpath, spath).findings if f.code == "ENGINE_FLAG_SHADOWS_KEY"]
    assert "radix_cache_page_size in [cache]" in hit.fix


def test_strict_exit_code_on_warnings(tmp_path: Path) -> None:
    cpath, spath = write(tmp_path, "", '{"mamba": {"state_snapshot_on_match": false}}')
    report = check_files(cpath, spath)
    assert report.ok and report.exit_code() == 0 and report.exit_code(strict=True) == 1
