"""Config -> `python -m runtime ...`, the bundled runtime's command line (SGLang's flag names, plus its own).

`RUNTIME_FLAGS` is the runtime's accepted flag set, read from the runtime's own option declaration in the shared
layer (hybridshared/flags/runtime_args.py).
"""

from __future__ import annotations

import sys

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.command import (
    EngineCommand,
    FlagSpec,
    add_extra_args,
    flags_to_argv,
    require_model_path,
)
from hybridctl.launch.translate import refuse_ignored, translate
from hybridshared.flags.fields import flag_fields
from hybridshared.flags.runtime_args import GRAMMAR_BACKENDS, SCHEDULE_POLICIES, RuntimeArgs


def _runtime_flags() -> dict[str, FlagSpec]:
    """Every flag of the runtime's parser, from its one declaration (`RuntimeArgs`): a bool that defaults to False
    is a switch; the values a flag takes are its choices, or those the parser's own checks hold it to."""
    checked = {"--grammar-backend": GRAMMAR_BACKENDS, "--schedule-policy": SCHEDULE_POLICIES}
    out = {}
    for field, spec in flag_fields(RuntimeArgs):
        name = spec.names[0]
        out[name] = FlagSpec(name, field.default is not False, spec.choices or checked.get(name) or ())
    return out


RUNTIME_FLAGS: dict[str, FlagSpec] = _runtime_flags()


def builtin_command(cfg: HybridConfig, python: str | None = None, allow_ignored: bool = False) -> EngineCommand:
    """The bundled runtime's command for `cfg`.

    Raises LaunchError for keys it would ignore (unless allowed) and for bad `extra_engine_args`.
    """
    require_model_path(cfg)
    translation = translate(cfg, "builtin")
    refuse_ignored(translation, allow_ignored)
    add_extra_args(translation, cfg.config.extra_engine_args, RUNTIME_FLAGS, "the bundled runtime")
    server = cfg.config.server
    argv = [python or sys.executable, "-m", "runtime", *flags_to_argv(translation.flags)]
    return EngineCommand(
        engine="builtin", role="server", argv=argv, host=server.host, port=server.port,
        ignored=translation.ignored,
    )  # fmt: skip
