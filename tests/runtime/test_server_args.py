"""`python -m runtime` command line: SGLang flag names, refusal of SGLang flags it lacks, start-up errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybridshared.flags.engine_flags import sglang_flags
from hybridshared.flags.flag_types import human_readable_int
from hybridshared.flags.runtime_args import RUNTIME_ONLY_FLAGS
from hybridshared.flags.runtime_parser import build_parser, parse_args

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_runtime(*argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )


def test_sglang_names_and_defaults() -> None:
    args = parse_args(["--model", "/m", "--page-size", "4", "--max-total-tokens", "32k", "--context-length", "8Ki"])
    assert args.model_path == "/m"
    assert args.page_size == 4
    assert args.max_total_tokens == 32000
    assert args.context_length == 8192
    assert args.host == "127.0.0.1"  # loopback unless --host says otherwise
    assert args.port == 30000
    assert args.schedule_policy == "fcfs"
    assert args.mamba_radix_cache_strategy == "auto"


def test_every_runtime_flag_is_an_sglang_flag_or_a_declared_own_flag() -> None:
    sglang = {name for info in sglang_flags().values() for name in (info.name, *info.aliases)}
    ours = {s for s in build_parser()._option_string_actions if s.startswith("--") and s != "--help"}
    assert ours - sglang == set(RUNTIME_ONLY_FLAGS)


def test_every_other_sglang_flag_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    ours = set(build_parser()._option_string_actions)
    refused = 0
    for info in sglang_flags().values():
        if info.name in ours:
            continue
        with pytest.raises(SystemExit) as exc:
            parse_args(["--model-path", "/m", info.name])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert f"{info.name} is an SGLang flag the bundled runtime does not implement" in err
        refused += 1
    assert refused > 400


def test_unimplemented_sglang_flag_exits_2_with_one_line() -> None:
    proc = run_runtime("--model-path", "/nonexistent", "--speculative-ngram-capacity=100")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "python -m runtime: error: --speculative-ngram-capacity is an SGLang flag the bundled runtime "
        "does not implement (see python -m runtime --help)"
    ]
    assert "Traceback" not in proc.stderr


def test_unknown_flag_is_an_argparse_error() -> None:
    proc = run_runtime("--model-path", "/m", "--no-such-flag")
    assert proc.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--tp-size", "2"], "--tp-size 2: the bundled runtime runs on one device"),
        (
            ["--schedule-policy", "random"],
            "--schedule-policy random: the bundled runtime implements fcfs, lpm",
        ),
        (["--mem-fraction-static", "1.5"], "must be in (0, 1)"),
        (["--chunked-prefill-size", "0"], "--chunked-prefill-size 0"),
        (["--decoding-step-tokens", "0"], "--decoding-step-tokens 0: use a positive number, auto, or -1"),
        (["--enable-mixed-chunk", "--disable-mixed-chunk"], "--enable-mixed-chunk and --disable-mixed-chunk"),
        (["--max-total-tokens", "lots"], "invalid integer 'lots'"),
    ],
)
def test_bad_values_are_refused(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-path", "/m", *argv])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_human_readable_int() -> None:
    assert human_readable_int("4096") == 4096
    assert human_readable_int("25.6k") == 25600
    assert human_readable_int("1Mi") == 1 << 20


def test_bad_model_path_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_runtime("--model-path", str(tmp_path / "missing"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"python -m runtime: error: --model-path {tmp_path / 'missing'}: no such directory "
        "(the runtime loads local models only)"
    ]


def test_directory_without_config_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_runtime("--model-path", str(tmp_path))
    assert proc.returncode == 2
    assert "config.json not found" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_pool_too_small_is_one_line_exit_2(demo_model_dir: Path) -> None:
    proc = run_runtime("--model-path", str(demo_model_dir), "--max-mamba-cache-size", "1", "--port", "1")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m runtime: error: "), proc.stderr
    assert "max_mamba_cache_size" in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "fired up" not in proc.stdout


def test_every_engine_flag_reaches_engine_args() -> None:
    from runtime.server.launch import _engine_args

    argv = ["--model-path", "/m", "--tokenizer-path", "/t", "--dtype", "half", "--page-size", "4",
            "--disable-radix-cache", "--mem-fraction-static", "0.5", "--memory-budget-gib", "2",
            "--mamba-full-memory-ratio", "1.5", "--max-mamba-cache-size", "9",
            "--mamba-ssm-dtype", "bfloat16",
            "--mamba-radix-cache-strategy", "no_buffer", "--mamba-track-interval", "32",
            "--max-running-requests", "7", "--max-total-tokens", "4k", "--chunked-prefill-size", "-1",
            "--schedule-policy", "lpm", "--disable-state-snapshot-on-match", "--disable-state-copy-on-write",
            "--disable-dual-lru-eviction", "--random-seed", "3", "--log-mamba-state-stats",
            "--context-length", "2048", "--disable-mixed-chunk", "--decoding-step-tokens", "1k"]  # fmt: skip
    ea = _engine_args(parse_args(argv), "cpu")
    assert (ea.model_path, ea.tokenizer_path, ea.dtype, ea.device) == ("/m", "/t", "float16", "cpu")
    assert (ea.page_size, ea.disable_radix_cache, ea.mem_fraction_static, ea.memory_budget_gib) == (
        4,
        True,
        0.5,
        2,
    )
    assert (ea.mamba_full_memory_ratio, ea.max_mamba_cache_size, ea.mamba_ssm_dtype) == (1.5, 9, "bfloat16")
    assert (ea.mamba_radix_cache_strategy, ea.mamba_track_interval) == ("no_buffer", 32)
    assert (ea.max_running_requests, ea.max_total_tokens, ea.chunked_prefill_size) == (7, 4000, -1)
    assert (ea.schedule_policy, ea.random_seed, ea.context_length) == ("lpm", 3, 2048)
    assert not (ea.state_snapshot_on_match or ea.state_copy_on_write or ea.dual_lru_eviction)
    assert ea.log_mamba_state_stats
    assert (ea.enable_mixed_chunk, ea.decoding_step_tokens) == (False, 1000)
