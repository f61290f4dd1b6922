"""The options many commands share, declared once: CONFIG and SETTINGS in either form (`takes_config_files`),
--json, and a server's --url and --api-key-env.

CONFIG and SETTINGS go positionally, `hybridctl CMD config.toml [settings.json]`, or as the articles write it,
`hybridctl CMD --config config.toml --settings settings.json`. The same file given both ways must be the same
path; settings.json defaults to the one beside config.toml (config.loader.settings_path_for).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

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
URL_OPT = typer.Option(None, "--url", help="Server URL (default: from config.toml [server] host/port).")
API_KEY_ENV_OPT = typer.Option(None, "--api-key-env", help="Environment variable that holds the server's API key.")

Command = TypeVar("Command", bound=Callable[..., Any])


def json_option(what: str = "the report") -> Any:
    """--json, which every command has: `what` it prints as JSON instead of the rendered text."""
    return typer.Option(False, "--json", help=f"Print {what} as JSON.")


@dataclass(frozen=True)
class ConfigFiles:
    """CONFIG and SETTINGS as given, either way; None where neither gave it (the command applies its default)."""

    config: Path | None
    settings: Path | None


NO_FILES = ConfigFiles(None, None)  # a `files` parameter's default; `takes_config_files` puts the flags in its place


def takes_config_files(*, reads_settings: bool = True) -> Callable[[Command], Command]:
    """A command whose `files: ConfigFiles` parameter is CONFIG [SETTINGS] --config --settings on the command line
    (in that parameter's place), checked by `config_files`. `reads_settings=False` (status, stop): --settings is
    accepted and ignored, and there is no SETTINGS argument."""

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        file_params = [
            ("config", CONFIG_ARG),
            *([("settings", SETTINGS_ARG)] if reads_settings else []),
            ("config_opt", CONFIG_OPT),
            ("settings_opt", SETTINGS_OPT if reads_settings else UNUSED_SETTINGS_OPT),
        ]
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name != "files":
                params.append(param)
                continue
            params += [
                inspect.Parameter(name, param.kind, default=d, annotation=Path | None) for name, d in file_params
            ]

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            config, config_opt, settings_opt = given.pop("config"), given.pop("config_opt"), given.pop("settings_opt")
            settings = given.pop("settings") if reads_settings else None
            if not reads_settings:
                settings_opt = None  # accepted for uniformity, not read
            files = ConfigFiles(*config_files(config, settings, config_opt, settings_opt))
            return command(**given, files=files)

        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
        return cast("Command", run)

    return decorate


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
