"""`hybridctl verify` flags: each default shown in --help is the library's default, and each flag reaches it."""

from __future__ import annotations

from dataclasses import fields

import typer.main

from hybridctl.cli import app
from hybridctl.cli.verify_cmd import SPEC_FLAGS, _options
from hybridctl.verify.prefix_judge import PrefixCacheOptions
from hybridctl.verify.spec import SpecOptions
from hybridctl.verify.structured import StructuredOptions
from hybridctl.verify.upstream import UpstreamOptions

_TARGET_PARAMS = {"url", "config", "settings", "config_opt", "settings_opt", "api_key_env", "as_json"}


def _verify_params() -> dict[str, dict[str, object]]:
    group = typer.main.get_command(app).commands["verify"]  # type: ignore[attr-defined]
    return {
        name: {p.name: p.default for p in command.params if p.name not in _TARGET_PARAMS}
        for name, command in group.commands.items()
    }


def test_flag_defaults_are_the_library_defaults() -> None:
    library = {f.name: f.default for f in fields(PrefixCacheOptions)}
    library.update(
        {flag: next(f.default for f in fields(SpecOptions) if f.name == field) for flag, field in SPEC_FLAGS.items()}
    )
    params = _verify_params()
    assert set(params) == {"all", "basic", "prefix-cache", "spec", "structured", "upstream"}
    structured = {f.name: f.default for f in fields(StructuredOptions) if f.name != "schema"}
    assert params.pop("structured") == {**structured, "schema": None}  # None: the built-in DEFAULT_SCHEMA
    own = {"upstream": {f.name: f.default for f in fields(UpstreamOptions)}}  # its own options class
    for command, defaults in params.items():
        for name, default in defaults.items():
            assert default == own.get(command, library)[name], f"verify {command} --{name.replace('_', '-')}"


def test_each_flag_lands_in_its_options_field() -> None:
    opts = _options(doc_tokens=4096, trials=7, seed=3, spec_requests=9, min_accept_length=2.5)
    assert (opts.prefix_cache.doc_tokens, opts.prefix_cache.trials, opts.prefix_cache.seed) == (4096, 7, 3)
    assert (opts.spec.requests, opts.spec.min_accept_length) == (9, 2.5)
    untouched = _options()
    assert untouched.prefix_cache == PrefixCacheOptions() and untouched.spec == SpecOptions()
