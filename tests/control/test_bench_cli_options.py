"""`hybridctl bench` flags: each default shown in --help is the default of the library's option records."""

from __future__ import annotations

import math
from dataclasses import MISSING, fields

import typer.main

from hybridctl.bench.datasets import RandomShape, SharedPrefixShape
from hybridctl.bench.loadgen import LoadShape
from hybridctl.bench.runner import BenchOptions
from hybridctl.cli import app


def _defaults(*records: type) -> dict[str, object]:
    return {f.name: f.default for record in records for f in fields(record) if f.default is not MISSING}


def test_flag_defaults_are_the_library_defaults() -> None:
    library = _defaults(SharedPrefixShape, RandomShape, LoadShape, BenchOptions)
    command = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    compared = 0
    for param in command.params:
        if param.name in library:
            expected = library[param.name]
            if isinstance(expected, float) and math.isinf(expected):
                assert math.isinf(param.default), param.name
            else:
                assert param.default == expected, f"--{param.name.replace('_', '-')}"
            compared += 1
    assert compared >= 12  # every shape, load and dataset flag
