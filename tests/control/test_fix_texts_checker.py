"""The checker of tests/control/test_fix_texts.py on examples: it catches each kind of wrong name (each would
otherwise pass unnoticed) and accepts the ways a text names a real one."""

from __future__ import annotations

import pytest

from tests.control.test_fix_texts import Text, problems


@pytest.mark.parametrize(
    "text, commands, wrong",
    [
        ("raise memory.memory_budget_gib (--memory-budget-gib)", ("init",), "--memory-budget-gib"),
        ("pass --api-key-env NAME", ("verify", "status"), "--api-key-env"),
        ("pass --sglang-version 0.5.6", ("validate", "doctor"), "--sglang-version"),
        ("SGLang's --no-such-flag", ("plan",), "--no-such-flag"),
        ("the runtime's --mamba-scheduler-strategy", ("plan",), "--mamba-scheduler-strategy"),
        ("set memory.no_such_key", ("plan",), "memory.no_such_key"),
        ("fix [server] host/prot in config.toml", ("verify",), "prot"),
        ("relaunch it with `hybridctl launch`", ("verify",), "hybridctl launch"),
        ("regenerate it with scripts/no_such_script.py", ("validate",), "scripts/no_such_script.py"),
        ("run benchmarks/gpu_check.py --no-such-flag", ("doctor",), "--no-such-flag"),
    ],
)
def test_the_checker_catches_each_kind_of_wrong_name(text: str, commands: tuple[str, ...], wrong: str) -> None:
    found = problems(Text("example", text, commands))
    assert found and wrong in found[0], found


@pytest.mark.parametrize(
    "text, commands",
    [
        ("pass --gpu-mem-gib 80", ("plan", "init", "doctor")),
        ("raise memory.memory_budget_gib (--memory-budget-gib of plan and of the runtime)", ("plan", "doctor")),
        ("upgrade SGLang (--sglang-version 0.5.9 of validate, plan and launch)", ("doctor",)),
        ("(SGLang: --enable-metrics)", ("bench",)),
        ("--model of plan and init", ("doctor",)),
        ("the runtime's --memory-budget-gib", ("plan",)),
        ("--trials must be >= 2", ("verify",)),
        ("restart: `hybridctl stop`, then `hybridctl launch`", ("verify",)),
        ("benchmarks/gpu_check.py --device cuda checks that path", ("doctor",)),
    ],
)
def test_the_checker_accepts_real_names(text: str, commands: tuple[str, ...]) -> None:
    assert problems(Text("example", text, commands)) == []
