"""The SGLang mapping table: it covers every config key, names only flags that exist, gates versions, refuses
values SGLang would ignore, and docs/sglang-mapping.md is generated from it."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from hybridctl.config.schema import ConfigToml, HybridConfig, SettingsJson
from hybridctl.launch.mapping import ROWS
from hybridctl.launch.mapping_doc import DOC_PATH, render_markdown
from hybridctl.launch.pd import pd_plan
from hybridctl.launch.sglang import sglang_command, sglang_translation, to_config_yaml
from hybridctl.launch.translate import LaunchError
from hybridshared.flags.engine_flags import sglang_flags

VERSION = "0.5.23"


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys |= _leaf_keys(annotation, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def _cfg(config: dict[str, object] | None = None, settings: dict[str, object] | None = None) -> HybridConfig:
    data = {"config": {"server": {"model_path": "/models/m"}}, "settings": settings or {}}
    for section, values in (config or {}).items():
        data["config"].setdefault(section, {}).update(values)  # type: ignore[union-attr,attr-defined]
    return HybridConfig.model_validate(data)


def test_every_config_and_settings_key_has_exactly_one_row() -> None:
    rows = [row.qualified for row in ROWS]
    assert len(rows) == len(set(rows)), "duplicate rows"
    expected = {f"config.toml:{k}" for k in _leaf_keys(ConfigToml)} | {
        f"settings.json:{k}" for k in _leaf_keys(SettingsJson)
    }
    assert set(rows) == expected


def test_every_flag_named_for_0_5_23_exists_in_its_flag_table() -> None:
    table = sglang_flags(VERSION)
    names = {opt for info in table.values() for opt in (info.name, *info.aliases)}
    for row in ROWS:
        for target in row.sglang:
            if target.flag and target.applies_to(VERSION):
                assert target.flag in names, f"{row.key}: {target.flag} is not an SGLang {VERSION} flag"
            elif target.flag:
                assert target.flag not in names, f"{row.key}: {target.flag} is gated off but exists in {VERSION}"


def test_defaults_launch_on_sglang_with_nothing_ignored() -> None:
    for version in ("0.5.23", "0.5.14", "0.5.7", "0.5.2"):
        assert sglang_translation(_cfg(), version).ignored == []


@pytest.mark.parametrize(
    ("config", "settings", "key"),
    [
        ({"cache": {"enable_dual_lru_eviction": False}}, None, "cache.enable_dual_lru_eviction"),
        (None, {"mamba": {"state_snapshot_on_match": False}}, "mamba.state_snapshot_on_match"),
        (None, {"mamba": {"state_copy_on_write": False}}, "mamba.state_copy_on_write"),
        (None, {"logging": {"log_mamba_state_stats": True}}, "logging.log_mamba_state_stats"),
        ({"memory": {"memory_budget_gib": 2.0}}, None, "memory.memory_budget_gib"),
        (
            {"memory": {"enable_elastic_memory_pool": True, "elastic_realloc_timeout_s": 30.0}},
            None,
            "memory.elastic_realloc_timeout_s",
        ),
        (
            {"speculative": {"speculative_algorithm": "EAGLE", "enable_mamba_state_sandbox": False}},
            None,
            "speculative.enable_mamba_state_sandbox",
        ),
        (
            {"pd": {"enable_pd_disaggregation": True, "mamba_state_transfer_mode": "layerwise"}},
            None,
            "pd.mamba_state_transfer_mode",
        ),
    ],
)
def test_values_sglang_would_silently_ignore_are_refused(
    config: dict[str, object] | None, settings: dict[str, object] | None, key: str
) -> None:
    cfg = _cfg(config, settings)
    with pytest.raises(LaunchError, match=key.replace(".", r"\.")) as err:
        sglang_translation(cfg, VERSION)
    assert "--allow-ignored" in str(err.value)
    assert [i.key for i in sglang_translation(cfg, VERSION, allow_ignored=True).ignored] == [key]


def test_timeout_is_moot_without_the_elastic_pool() -> None:
    assert sglang_translation(_cfg({"memory": {"elastic_realloc_timeout_s": 30.0}}), VERSION).ignored == []


@pytest.mark.parametrize(
    ("version", "strategy_flag"),
    [("0.5.23", "--mamba-radix-cache-strategy"), ("0.5.14", "--mamba-radix-cache-strategy"),
     ("0.5.13", "--mamba-scheduler-strategy"), ("0.5.7", "--mamba-scheduler-strategy"), ("0.5.6", None)],
)  # fmt: skip
def test_strategy_flag_follows_the_rename(version: str, strategy_flag: str | None) -> None:
    argv = sglang_command(_cfg({"cache": {"mamba_radix_cache_strategy": "extra_buffer"}}), version,
                          allow_ignored=True).argv  # fmt: skip
    flags = {a for a in argv if a.startswith("--mamba-") and a.endswith("-strategy")}
    assert flags == ({strategy_flag} if strategy_flag else set())
    if strategy_flag:
        assert argv[argv.index(strategy_flag) + 1] == "extra_buffer"
    else:
        with pytest.raises(LaunchError, match="no flag before SGLang 0.5.7"):
            sglang_command(_cfg({"cache": {"mamba_radix_cache_strategy": "extra_buffer"}}), version)


def test_extra_buffer_lazy_did_not_exist_before_0_5_13() -> None:
    lazy = _cfg({"cache": {"mamba_radix_cache_strategy": "extra_buffer_lazy"}})
    with pytest.raises(LaunchError, match="extra_buffer_lazy"):
        sglang_command(lazy, "0.5.12")
    # 0.5.13's --mamba-scheduler-strategy takes it (its own parser's choices, hybridshared/data)
    assert "--mamba-scheduler-strategy" in sglang_command(lazy, "0.5.13").argv


def test_elastic_pool_is_unified_memory_from_0_5_15() -> None:
    cfg = _cfg({"memory": {"enable_elastic_memory_pool": True}})
    assert "--enable-unified-memory" in sglang_command(cfg, "0.5.15").argv
    with pytest.raises(LaunchError, match="enable_elastic_memory_pool"):
        sglang_command(cfg, "0.5.14")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"enable-metrcs": True}, "did you mean --enable-metrics"),
        ({"tp-size": 2}, r"already set from config\.toml:server\.tp_size"),
        ({"kv-cache-dtype": "int3"}, "not one of"),
        ({"admin_api_key": "x"}, "secret"),
        ({"enable-metrics": 1}, "switch"),
    ],
)
def test_extra_engine_args_are_checked_against_the_flag_table(extra: dict[str, object], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        sglang_command(_cfg({"extra_engine_args": extra}), VERSION)


def test_extra_engine_args_accept_aliases_and_underscores() -> None:
    cfg = _cfg({"extra_engine_args": {"nccl_init_addr": "10.0.0.1:5000", "enable_metrics": True,
                                      "enable-cache-report": False}})  # fmt: skip
    argv = sglang_command(cfg, VERSION).argv
    assert argv[argv.index("--dist-init-addr") + 1] == "10.0.0.1:5000"
    assert "--enable-metrics" in argv and "--enable-cache-report" not in argv


def test_yaml_keeps_boolean_optional_flags_on_the_command_line() -> None:
    cfg = _cfg({"extra_engine_args": {"mm-enable-dp-encoder": True, "enable-metrics": True}})
    text, leftover = to_config_yaml(sglang_translation(cfg, VERSION).flags, VERSION)
    assert leftover == ["--mm-enable-dp-encoder"]
    assert "enable-metrics: true" in text.splitlines()
    assert not any(line.startswith("mm-enable-dp-encoder") for line in text.splitlines())
    assert 'model-path: "/models/m"' in text.splitlines() and "port: 30000" in text.splitlines()


def test_pd_needs_distinct_ports_and_owns_the_role_flags() -> None:
    with pytest.raises(LaunchError, match="four different ports"):
        pd_plan(_cfg({"pd": {"enable_pd_disaggregation": True, "prefill_port": 30000}}), VERSION)
    cfg = _cfg({"pd": {"enable_pd_disaggregation": True}, "extra_engine_args": {"disaggregation-mode": "prefill"}})
    with pytest.raises(LaunchError, match="PD sets per server"):
        pd_plan(cfg, VERSION)


def test_k8s_manifests_run_the_same_commands() -> None:
    yaml = pytest.importorskip("yaml")
    from hybridctl.launch.k8s import k8s_manifests

    cfg = _cfg({"server": {"model_path": "/models/qwen3-next", "tp_size": 2},
                "pd": {"enable_pd_disaggregation": True}})  # fmt: skip
    docs = [d for d in yaml.safe_load_all(k8s_manifests(cfg, VERSION)) if d]
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("Deployment", "hybridctl-prefill"), ("Service", "hybridctl-prefill"),
        ("Deployment", "hybridctl-decode"), ("Service", "hybridctl-decode"),
        ("Deployment", "hybridctl-router"), ("Service", "hybridctl-router"),
    ]  # fmt: skip
    prefill = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert prefill["command"][:3] == ["python3", "-m", "sglang.launch_server"]
    assert prefill["resources"]["limits"]["nvidia.com/gpu"] == 2
    cmd = prefill["command"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0" and cmd[cmd.index("--disaggregation-mode") + 1] == "prefill"
    router = docs[4]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert router[router.index("--prefill") + 1] == "http://hybridctl-prefill:30100"
    multi = _cfg({"server": {"tp_size": 16, "nnodes": 2, "dist_init_addr": "10.0.0.1:5000"}})
    (statefulset, *_services) = [d for d in yaml.safe_load_all(k8s_manifests(multi, VERSION)) if d]
    assert statefulset["kind"] == "StatefulSet" and statefulset["spec"]["replicas"] == 2
    assert "$(NODE_RANK)" in statefulset["spec"]["template"]["spec"]["containers"][0]["command"]


def test_docs_mapping_is_generated_from_the_table() -> None:
    assert DOC_PATH.read_text(encoding="utf-8") == render_markdown(), (
        "docs/sglang-mapping.md is stale: run `python -m hybridctl.launch.mapping_doc`"
    )


def test_multinode_needs_an_address_and_a_rank_below_the_node_count() -> None:
    with pytest.raises(LaunchError, match="dist_init_addr is unset"):
        sglang_command(_cfg({"server": {"nnodes": 2}}), VERSION)
    with pytest.raises(LaunchError, match="node_rank = 2 is not below nnodes = 2"):
        sglang_command(_cfg({"server": {"nnodes": 2, "node_rank": 2, "dist_init_addr": "10.0.0.1:5000"}}), VERSION)
    argv = sglang_command(_cfg({"server": {"nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:5000"}}),
                          VERSION).argv  # fmt: skip
    assert argv[argv.index("--node-rank") + 1] == "1" and argv[argv.index("--nnodes") + 1] == "2"
