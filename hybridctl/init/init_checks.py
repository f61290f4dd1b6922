"""What `hybridctl init` decides before it writes: the model path, the engine, and `validate`'s verdict.

init writes only what `hybridctl validate` accepts: the rendered files go through the very `check_files` call
validate makes (same SGLang release, same auto engine, same engine notes), so the two never disagree.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from hybridctl.config.findings import Finding
from hybridctl.launch.plan import choose_engine
from hybridctl.launch.sglang import installed_sglang_version
from hybridctl.launch.translate import engine_findings
from hybridctl.model.bundled import bundled_stand_in, exists_here, known_names, known_names_hint
from hybridctl.rules.check import check_files
from hybridctl.rules.server_rules import is_hub_id


class InitError(Exception):
    """init cannot proceed; the message says what to change."""


@dataclass(frozen=True)
class ModelChoice:
    """The model as init writes it (`model_path`) and where its config.json is read for sizing (`source`)."""

    model_path: str
    source: Path
    note: str | None = None
    on_this_host: bool = True  # False: a bundled config.json stands in for a model the server holds


def choose_model(model: str) -> ModelChoice:
    """A model directory or config.json here; else a checkpoint hybridctl bundles a config.json for, kept as
    given (a hub id, or the path on the server that will hold it)."""

    path = Path(model).expanduser()
    if exists_here(model):
        path = path.resolve()
        if path.is_dir():
            return ModelChoice(str(path), path)
        if path.name == "config.json":
            return ModelChoice(str(path.parent), path)
        # validate refuses a file as server.model_path (engines load a directory): say so before sizing anything
        raise InitError(
            f"--model {model}: a file, and config.toml's server.model_path must name the model directory the "
            "server loads. Pass the directory (or the config.json inside it); without the files, a hub id or the "
            f"path on the server of a checkpoint hybridctl knows ({known_names()})."
        )
    bundled = bundled_stand_in(model)
    if bundled is None:
        raise InitError(
            f"--model {model}: no such file or directory here, and not a checkpoint hybridctl bundles a "
            f"config.json for. Pass a model directory or its config.json; {known_names_hint()}."
        )

    where = "SGLang on the server downloads it" if is_hub_id(model) else "the server must hold the model at this path"
    note = f"{bundled.note()}; {where}"
    return ModelChoice(model, bundled.config_json, note, on_this_host=False)


def refuse_remote_model_on_builtin(choice: ModelChoice, decision: EngineDecision) -> None:
    """The bundled runtime loads the model from this machine: a model that is not here cannot be sized for it
    (validate's MODEL_PATH_NOT_FOUND), and is refused before the sizing error would hide why."""
    if choice.on_this_host or decision.resolved != "builtin":
        return

    other = "" if decision.hint() else " Or pass --engine sglang to write the config for a GPU server."
    hub_id = choice.model_path if is_hub_id(choice.model_path) else "ORG/NAME"
    raise InitError(
        f"--model {choice.model_path}: not on this host, and the bundled runtime (engine {decision.written} here) "
        f"loads a model directory from this machine. Download it (huggingface-cli download {hub_id} --local-dir "
        f"DIR) and pass --model DIR.{other}{decision.hint()}"
    )


@dataclass(frozen=True)
class EngineDecision:
    written: str  # server.engine in config.toml: auto | sglang | builtin
    resolved: str  # what serves it, as validate and launch resolve `written` here: sglang | builtin
    here: str  # what auto resolves to on this host
    here_reason: str
    note: str | None = None

    def hint(self) -> str:
        """For an error under an `auto` that means the bundled runtime here: the flag that writes a server config."""
        if self.written != "auto" or self.resolved != "builtin":
            return ""
        return (
            f"\nengine auto is the bundled runtime on this host ({self.here_reason}); to write a config for an "
            "SGLang GPU server, pass --engine sglang (with --gpu-mem-gib, one GPU's memory, to size it)."
        )


def decide_engine_for_init(requested: str, *, tp: int, gpu_mem_gib: float | None) -> EngineDecision:
    """The engine init records. `auto` stays auto when it resolves here to an engine the flags fit; when auto is the
    bundled runtime here but --tp > 1 or --gpu-mem-gib describe a GPU server (as `plan` reads them too), init
    records sglang, the engine auto picks on such a server, so validate/plan/launch judge the server it is for."""

    here = choose_engine("auto")
    if requested != "auto":
        return EngineDecision(requested, requested, here.engine, here.reason)
    if here.engine == "sglang":
        return EngineDecision("auto", "sglang", here.engine, here.reason)
    implied = [f"--tp {tp}"] if tp > 1 else []
    if gpu_mem_gib is not None:
        implied.append(f"--gpu-mem-gib {gpu_mem_gib:g}")
    if not implied:
        return EngineDecision("auto", "builtin", here.engine, here.reason)
    verb = "describe" if len(implied) > 1 else "describes"
    why_here = here.reason.split(":", 1)[0]  # "no NVIDIA GPU and sglang not installed"
    note = (
        f"{' '.join(implied)} {verb} a GPU server, where auto picks SGLang; here ({why_here}) auto would be the "
        "bundled runtime, which serves on one device. Pass --engine builtin for the bundled runtime."
    )
    return EngineDecision("sglang", "sglang", here.engine, here.reason, note)


def validate_as_written(
    config_text: str, settings_text: str, out_dir: Path, *, auto_engine: str, template: bool
) -> list[Finding]:
    """`hybridctl validate`'s findings on the files init is about to write into `out_dir` (checked in a temporary
    directory, reported under their final names). `template` (no --model): the empty model_path is the user's next
    step, so it is a warning, not a refusal."""

    names = {"config.toml": out_dir / "config.toml", "settings.json": out_dir / "settings.json"}
    with tempfile.TemporaryDirectory(prefix="hybridctl-init-") as tmp:
        staged = {name: Path(tmp) / name for name in names}
        staged["config.toml"].write_text(config_text, encoding="utf-8")
        staged["settings.json"].write_text(settings_text, encoding="utf-8")
        report = check_files(
            staged["config.toml"],
            staged["settings.json"],
            engine_version=installed_sglang_version(),
            auto_engine=auto_engine,
            engine_notes=engine_findings,
        )
    by_staged = {str(staged[n]): str(final) for n, final in names.items()}

    def final(text: str) -> str:  # fixes name the file they edit: the one init writes, not the staged copy
        for staged_name, final_name in by_staged.items():
            text = text.replace(staged_name, final_name)
        return text

    findings = [replace(f, file=final(f.file), message=final(f.message), fix=final(f.fix)) for f in report.findings]
    if template:
        findings = [replace(f, severity="warning") if f.code == "MODEL_PATH_MISSING" else f for f in findings]
    return findings
