"""CONFIG and SETTINGS as every command that reads them takes them, in either form.

Positionally, `hybridctl CMD config.toml [settings.json]`, or as the articles write it, `hybridctl CMD --config
config.toml --settings settings.json`. The same file given both ways must be the same path; settings.json defaults
to the one beside config.toml (config.loader.settings_path_for).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from hybridctl.cli.output import fail

if TYPE_CHECKING:
    from hybridctl.config.schema import EngineName

DEFAULT_CONFIG = Path("config.toml")
# The bound of every memory-size flag, as of the config keys they stand for: planner.units.MAX_MEMORY_GIB (and its
# bytes), spelled here because command modules import no hybridctl library at load (`--help` stays fast);
# tests/control/test_no_traceback.py holds the two equal.
MAX_MEMORY_GIB = 1 << 20
MAX_MEMORY_BYTES = MAX_MEMORY_GIB << 30
CONFIG_ARG = typer.Argument(
    None, metavar="CONFIG", show_default=False, help="config.toml (or --config; default: ./config.toml)."
)
SETTINGS_ARG = typer.Argument(
    None, metavar="SETTINGS", show_default=False,
    help="settings.json (or --settings; default: the one beside config.toml).",
)  # fmt: skip
CONFIG_OPT = typer.Option(None, "--config", "-c", show_default=False, help="config.toml: the same as CONFIG.")
SETTINGS_OPT = typer.Option(None, "--settings", "-s", show_default=False, help="settings.json: the same as SETTINGS.")
# status and stop need only config.toml; they take --settings too, so one argument list works for every command.
UNUSED_SETTINGS_OPT = typer.Option(
    None, "--settings", "-s", show_default=False, help="settings.json (accepted for uniformity; not read here)."
)


def _one(what: str, positional: Path | None, option: Path | None) -> Path | None:
    if positional is not None and option is not None and positional != option:
        raise fail(
            f"{what} given twice, as {positional} and as --{what.lower()} {option}. Fix: give it once, either way."
        )
    return positional if positional is not None else option


def config_files(
    config: Path | None, settings: Path | None, config_opt: Path | None, settings_opt: Path | None
) -> tuple[Path | None, Path | None]:
    """(config, settings) from either form; None where neither gave it (the command applies its default)."""
    return _one("CONFIG", config, config_opt), _one("SETTINGS", settings, settings_opt)


def engine_option(engine: str | None) -> EngineName | None:
    """--engine as given, checked against the engine names (launch, plan and validate take the same ones)."""
    from hybridctl.launch.plan import ENGINE_NAMES

    if engine is not None and engine not in ENGINE_NAMES:
        raise fail(f"--engine {engine}: use {', '.join(ENGINE_NAMES)}")
    return cast("EngineName | None", engine)
