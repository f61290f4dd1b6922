"""`RuntimeArgs` is the one source of the runtime's options: its fields' metadata generates the parser and derives
the engine's `EngineArgs`. No torch and no server here: these run in milliseconds."""

from __future__ import annotations

import argparse
import operator
from dataclasses import dataclass, fields

import pytest

from hybridshared.flags.fields import add_flags, engine_targets, engine_values, flag, flag_fields, group_flags
from hybridshared.flags.runtime_args import RUNTIME_ONLY_FLAGS, RuntimeArgs
from hybridshared.flags.runtime_parser import build_parser, parse_args
from runtime.core.config import EngineArgs, engine_args


def test_every_option_is_a_flag_and_every_flag_an_option() -> None:
    declared = {f.name for f, _ in flag_fields(RuntimeArgs)}
    assert declared == {f.name for f in fields(RuntimeArgs)}
    parser = build_parser()
    dests = {a.dest for a in parser._actions if a.option_strings and a.dest != "help"}
    assert dests == declared


def test_every_engine_option_comes_from_exactly_one_flag() -> None:
    targets = list(engine_targets(RuntimeArgs).values())
    assert len(targets) == len(set(targets)), "two flags set the same engine option"
    # `device` is the resolved one (server/launch.py), every other engine option is a flag's.
    assert set(targets) == {f.name for f in fields(EngineArgs)} - {"device"}


def test_engine_args_are_derived_with_conversions_and_none_left_to_the_engine() -> None:
    args = parse_args(["--model-path", "/m", "--dtype", "half", "--disable-dual-lru-eviction", "--port", "1"])
    ea = engine_args(args, "cpu")
    assert (ea.model_path, ea.dtype, ea.device) == ("/m", "float16", "cpu")
    assert ea.dual_lru_eviction is False and ea.state_copy_on_write is True
    # Unset options keep the engine's own defaults rather than the parser's None.
    assert ea.page_size == EngineArgs.page_size and ea.mem_fraction_static == EngineArgs.mem_fraction_static


def test_a_new_field_is_a_flag_and_an_engine_option_in_one_place() -> None:
    """The generator itself, on a dataclass of its own: names, aliases, switches, groups, conversions."""

    @dataclass
    class Options:
        path: str = flag("--path", "--p-alias", required=True, help="A path.")
        count: int | None = flag("--count", type=int, group="extra")
        quiet: bool = flag("--quiet", default=False, group="extra", engine="loud", to_engine=operator.not_)
        port: int = flag("--port", default=5, type=int, engine=None)

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_flags(parser, Options)
    opts = Options(**vars(parser.parse_args(["--p-alias", "/x", "--quiet"])))
    assert (opts.path, opts.count, opts.quiet, opts.port) == ("/x", None, True, 5)
    assert engine_values(opts) == {"path": "/x", "loud": False}
    assert group_flags(Options, "extra") == ("--count", "--quiet")
    with pytest.raises(SystemExit):
        parser.parse_args(["--count", "3"])  # --path is required


def test_runtime_only_flags_are_the_own_group() -> None:
    parser = build_parser()
    own = next(g for g in parser._action_groups if g.title and g.title.startswith("bundled-runtime"))
    assert set(RUNTIME_ONLY_FLAGS) == {a.option_strings[0] for a in own._group_actions}
