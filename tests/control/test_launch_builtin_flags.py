"""The bundled runtime's command line for a matrix of configs, parsed by the runtime's real parser.

hybridshared/flags/runtime_parser.py imports no torch, so these stay control-plane tests: whatever hybridctl emits must
parse there and land on the fields the config asked for.
"""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.builtin_flags import RUNTIME_FLAGS, builtin_command
from hybridctl.launch.translate import LaunchError
from hybridshared.flags.runtime_args import RuntimeArgs
from hybridshared.flags.runtime_parser import build_parser, parse_args


def _cfg(**sections: dict[str, object]) -> HybridConfig:
    data: dict[str, dict[str, object]] = {
        "config": {"server": {"model_path": "/models/demo"}},
        "settings": {},
    }
    for dotted, values in sections.items():
        file, section = dotted.split("__")
        data[file].setdefault(section, {}).update(values)  # type: ignore[union-attr]
    return HybridConfig.model_validate(data)


def _parsed(cfg: HybridConfig) -> RuntimeArgs:
    argv = builtin_command(cfg, python="python").argv
    assert argv[:3] == ["python", "-m", "runtime"]
    return parse_args(argv[3:])


MATRIX = [
    pytest.param(
        {},
        {
            "model_path": "/models/demo",
            "host": "127.0.0.1",
            "port": 30000,
            "page_size": 1,
            "disable_radix_cache": False,
            "mem_fraction_static": 0.85,
            "mamba_full_memory_ratio": 0.9,
            "mamba_ssm_dtype": "float32",
            "mamba_radix_cache_strategy": "auto",
            "mamba_track_interval": 256,
            "chunked_prefill_size": 8192,
            "schedule_policy": "fcfs",
            "log_level": "info",
            "disable_overlap_schedule": False,
        },
        id="defaults",
    ),
    pytest.param(
        {
            "config__server": {
                "host": "0.0.0.0",
                "port": 31000,
                "tokenizer_path": "/tok",
                "trust_remote_code": True,
            }
        },
        {"host": "0.0.0.0", "port": 31000, "tokenizer_path": "/tok", "trust_remote_code": True},
        id="server",
    ),
    pytest.param(
        {
            "config__memory": {
                "mem_fraction_static": 0.5,
                "mamba_full_memory_ratio": 2.5,
                "max_mamba_cache_size": 12,
                "memory_budget_gib": 1.5,
            }
        },
        {
            "mem_fraction_static": 0.5,
            "mamba_full_memory_ratio": 2.5,
            "max_mamba_cache_size": 12,
            "memory_budget_gib": 1.5,
        },
        id="memory",
    ),
    pytest.param({"config__cache": {"enable_prefix_caching": False}}, {"disable_radix_cache": True}, id="prefix-off"),
    pytest.param(
        {"settings__runtime": {"disable_radix_cache": True}},
        {"disable_radix_cache": True},
        id="radix-off-in-settings",
    ),
    pytest.param(
        {
            "config__cache": {
                "radix_cache_page_size": 16,
                "mamba_radix_cache_strategy": "extra_buffer",
                "mamba_track_interval": 64,
                "enable_dual_lru_eviction": False,
            }
        },
        {
            "page_size": 16,
            "mamba_radix_cache_strategy": "extra_buffer",
            "mamba_track_interval": 64,
            "disable_dual_lru_eviction": True,
            "disable_overlap_schedule": False,
        },
        id="extra-buffer",
    ),
    pytest.param(
        {"config__cache": {"mamba_radix_cache_strategy": "no_buffer"}},
        {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True},
        id="no-buffer",
    ),
    pytest.param(
        {
            "settings__runtime": {
                "chunked_prefill_size": -1,
                "max_running_requests": 7,
                "schedule_policy": "lpm",
            }
        },
        {"chunked_prefill_size": -1, "max_running_requests": 7, "schedule_policy": "lpm"},
        id="runtime",
    ),
    pytest.param(
        {
            "settings__mamba": {
                "state_dtype": "bfloat16",
                "state_snapshot_on_match": False,
                "state_copy_on_write": False,
            }
        },
        {
            "mamba_ssm_dtype": "bfloat16",
            "disable_state_snapshot_on_match": True,
            "disable_state_copy_on_write": True,
        },
        id="mamba",
    ),
    pytest.param(
        {"settings__logging": {"level": "debug", "log_requests": True, "log_mamba_state_stats": True}},
        {"log_level": "debug", "log_requests": True, "log_mamba_state_stats": True},
        id="logging",
    ),
    pytest.param(
        {
            "config__speculative": {
                "speculative_algorithm": "STANDALONE",
                "speculative_num_steps": 2,
                "speculative_num_draft_tokens": 3,
                "speculative_draft_model_path": "/m/draft",
                "enable_mamba_state_sandbox": False,
            }
        },
        {
            "speculative_algorithm": "STANDALONE",
            "speculative_num_steps": 2,
            "speculative_num_draft_tokens": 3,
            "speculative_eagle_topk": 1,
            "speculative_draft_model_path": "/m/draft",
            "disable_mamba_state_sandbox": True,
        },
        id="speculative",
    ),
    pytest.param(
        {
            "settings__runtime": {
                "enable_torch_compile": True,
                "torch_compile_max_bs": 8,
                "torch_compile_max_extend_tokens": 16,
            }
        },
        {"enable_torch_compile": True, "torch_compile_max_bs": 8, "torch_compile_max_extend_tokens": 16},
        id="torch-compile",
    ),
    pytest.param(
        {
            "config__extra_engine_args": {
                "enable-metrics": True,
                "num_threads": 2,
                "--random-seed": 7,
                "served-model-name": "demo",
            }
        },
        {"enable_metrics": True, "num_threads": 2, "random_seed": 7, "served_model_name": "demo"},
        id="extra-args",
    ),
]


@pytest.mark.parametrize(("sections", "expected"), MATRIX)
def test_builtin_command_parses_to_the_configured_values(
    sections: dict[str, dict[str, object]], expected: dict[str, object]
) -> None:
    parsed = _parsed(_cfg(**sections))
    for field, value in expected.items():
        assert getattr(parsed, field) == value, field


def test_runtime_flag_set_matches_the_runtime_parser() -> None:
    parser = build_parser()
    real = {opt for action in parser._actions for opt in action.option_strings} - {"-h", "--help"}
    primary = {action.option_strings[0] for action in parser._actions if action.option_strings} - {"-h"}
    assert set(RUNTIME_FLAGS) == primary, "builtin_flags.RUNTIME_FLAGS drifted from hybridshared/flags/runtime_args.py"
    assert set(RUNTIME_FLAGS) <= real
    for name, spec in RUNTIME_FLAGS.items():
        action = parser._option_string_actions[name]
        assert spec.takes_value == (action.nargs != 0), name


@pytest.mark.parametrize(
    ("sections", "key"),
    [
        ({"config__server": {"tp_size": 2}}, "server.tp_size"),
        ({"config__server": {"dp_size": 2}}, "server.dp_size"),
        ({"config__speculative": {"speculative_algorithm": "EAGLE3"}}, "speculative.speculative_algorithm"),
        (
            {"config__speculative": {"speculative_algorithm": "NGRAM", "speculative_topk": 2}},
            "speculative.speculative_topk",
        ),
        (
            {"config__pd": {"enable_pd_disaggregation": True, "mamba_state_transfer_mode": "layerwise"}},
            "pd.mamba_state_transfer_mode",
        ),
        ({"settings__runtime": {"schedule_policy": "lof"}}, "runtime.schedule_policy"),
    ],
)
def test_keys_the_runtime_would_ignore_are_refused(sections: dict[str, dict[str, object]], key: str) -> None:
    cfg = _cfg(**sections)
    with pytest.raises(LaunchError, match=key.replace(".", r"\.")) as err:
        builtin_command(cfg)
    assert "--allow-ignored" in str(err.value)
    command = builtin_command(cfg, python="python", allow_ignored=True)
    assert [i.key for i in command.ignored] == [key]
    parse_args(command.argv[3:])  # what remains still parses


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"enable-metrcs": True}, "did you mean --enable-metrics"),
        ({"speculative-ngram-capacity": 100}, "not a flag of the bundled runtime"),
        ({"page-size": 4}, "already set from config.toml:cache.radix_cache_page_size"),
        ({"api-key": "abc"}, "secret"),
        ({"log-requests": "yes"}, "switch"),
        ({"dtype": "int4"}, "not one of"),
    ],
)
def test_bad_extra_engine_args_are_refused(extra: dict[str, object], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        builtin_command(_cfg(config__extra_engine_args=extra))


def test_empty_model_path_is_refused() -> None:
    with pytest.raises(LaunchError, match="model_path is empty"):
        builtin_command(HybridConfig())


_paths = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=20).map(
    lambda s: "/m/" + s
)


@settings(max_examples=60, deadline=None)
@given(
    model_path=_paths,
    page_size=st.integers(1, 256),
    strategy=st.sampled_from(["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"]),
    chunk=st.one_of(st.just(-1), st.integers(1, 1 << 16)),
    dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
    policy=st.sampled_from(["fcfs", "lpm"]),
    prefix=st.booleans(),
    snapshot=st.booleans(),
    ratio=st.floats(0.01, 10.0, allow_nan=False),
)
def test_any_config_gives_a_command_the_runtime_parses_back(
    model_path: str, page_size: int, strategy: str, chunk: int, dtype: str, policy: str, prefix: bool,
    snapshot: bool, ratio: float,
) -> None:  # fmt: skip
    cfg = _cfg(
        config__server={"model_path": model_path},
        config__cache={"radix_cache_page_size": page_size, "mamba_radix_cache_strategy": strategy,
                       "enable_prefix_caching": prefix},
        config__memory={"mamba_full_memory_ratio": ratio},
        settings__runtime={"chunked_prefill_size": chunk, "schedule_policy": policy},
        settings__mamba={"state_dtype": dtype, "state_snapshot_on_match": snapshot},
    )  # fmt: skip
    command = builtin_command(cfg, python="python")
    assert shlex.split(command.shell()) == command.argv
    parsed = parse_args(command.argv[3:])
    assert (parsed.model_path, parsed.page_size, parsed.mamba_radix_cache_strategy) == (
        model_path,
        page_size,
        strategy,
    )
    assert (parsed.chunked_prefill_size, parsed.mamba_ssm_dtype, parsed.schedule_policy) == (
        chunk,
        dtype,
        policy,
    )
    assert parsed.disable_radix_cache is not prefix and parsed.disable_state_snapshot_on_match is not snapshot
    assert parsed.mamba_full_memory_ratio == ratio


def test_api_key_env_is_passed_by_name_never_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-never-on-argv-4e1f"
    monkeypatch.setenv("HYBRID_SERVER_KEY", secret)
    cfg = _cfg(config__server={"api_key_env": "HYBRID_SERVER_KEY"})
    # The upstream gateway's key (settings.json api.api_key_env) is another key: never the server's.
    assert "--api-key-env" not in builtin_command(_cfg(settings__api={"api_key_env": "GATEWAY"}), python="p").argv
    argv = builtin_command(cfg, python="python").argv
    assert "--api-key-env" in argv and argv[argv.index("--api-key-env") + 1] == "HYBRID_SERVER_KEY"
    assert secret not in " ".join(argv) and "--api-key" not in argv
    args = parse_args(argv[3:])  # the runtime's real parser reads the key from the variable
    assert args.api_key == secret and args.public_dict()["api_key"] == "<redacted>"
    assert "--api-key-env" not in builtin_command(_cfg(), python="python").argv
