"""What validation reports: a `Finding` per problem, `ConfigError` when loading cannot go on, the report.

Also every finding code `validate` can report and what it means (FINDING_CODES: stable names scripts and the
doctor match), and how rules phrase findings (logical file names, the exact `set ... in ...` fix for a key).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from hybridctl.config.schema import HybridConfig

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """One problem in a config file, located as precisely as possible, with the exact change that fixes it."""

    severity: Severity
    code: str
    file: str
    line: int | None
    column: int | None
    key: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def location(self) -> str:
        """`file:line:column` as editors and terminals make clickable."""
        loc = self.file
        if self.line is not None:
            loc += f":{self.line}"
            if self.column is not None:
                loc += f":{self.column}"
        return loc

    def __str__(self) -> str:
        # The layout `validate` prints, so a finding reads the same from every command that shows one.
        key = f" {self.key}" if self.key else ""
        text = f"{self.location()}: {self.severity} {self.code}{key}: {self.message}"
        if self.fix:
            text += f" fix: {self.fix}"
        return text


class ConfigError(Exception):
    """The config files cannot be loaded; carries every error found, each with its file, line, key and fix."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = list(findings)
        super().__init__(str(self))

    def __str__(self) -> str:
        errors = [f for f in self.findings if f.severity == "error"] or self.findings
        head = f"{len(errors)} error{'s' if len(errors) != 1 else ''} in the configuration:"
        return "\n".join([head, *(f"  {f}" for f in errors)])


@dataclass
class ValidationReport:
    """Everything `check_files` found; `config` is the loaded configuration when the files were valid."""

    config_path: str
    settings_path: str
    findings: list[Finding] = field(default_factory=list)
    config: HybridConfig | None = None
    engine_version: str | None = None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def exit_code(self, strict: bool = False) -> int:
        """0 valid, 1 warnings under --strict, 2 errors (the `hybridctl validate` contract)."""
        if self.errors:
            return 2
        if strict and self.warnings:
            return 1
        return 0

    def sorted_findings(self) -> list[Finding]:
        return sorted(
            self.findings,
            key=lambda f: (SEVERITY_ORDER[f.severity], f.file, f.line or 0, f.column or 0, f.code),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "config_path": self.config_path,
            "settings_path": self.settings_path,
            "engine_version": self.engine_version,
            "valid": self.ok,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "findings": [f.to_dict() for f in self.sorted_findings()],
        }


FINDING_CODES: dict[str, str] = {
    # reading and parsing
    "FILE_NOT_FOUND": "config.toml does not exist (settings.json may be absent: defaults apply).",
    "FILE_UNREADABLE": "The path is a directory or cannot be read.",
    "FILE_ENCODING": "The file is not UTF-8 text.",
    "TOML_SYNTAX": "config.toml is not valid TOML (line and column given).",
    "JSON_SYNTAX": "settings.json is not valid JSON (line and column given).",
    "DUPLICATE_KEY": "A key appears twice: an error in TOML, a warning in JSON (only the last counts).",
    "SETTINGS_DEFAULTS": "settings.json is absent; every setting takes its default (info).",
    # schema
    "UNKNOWN_KEY": "A key the schema does not have; the fix names the closest key or where it belongs.",
    "WRONG_TYPE": 'A value of the wrong type (types are strict: "8080" is not a port).',
    "OUT_OF_RANGE": "A number outside the key's range (quoted from the schema).",
    "INVALID_CHOICE": "A value not among the key's choices.",
    "INVALID_VALUE": "A string not matching the key's pattern (e.g. api_key_env must name a variable).",
    "LITERAL_SECRET": "A literal credential in either file; name an environment variable instead.",
    # cross-file and engine rules (hybridctl/rules/cross_file.py, engine_flag_rules.py)
    "PREFIX_CACHE_MISS": "Settings that make prefix hits impossible, or that the engine refuses.",
    "PAGE_SIZE_MISMATCH": "extra_buffer needs mamba_track_interval to be a multiple of the page size.",
    "SPEC_ROLLBACK": "Speculative decoding that cannot roll the recurrent state back to the accepted token.",
    "SPEC_DRAFT_MODEL": "STANDALONE speculative decoding without a draft model.",
    "PD_STATE_MISMATCH": "PD disaggregation whose state transfer can disagree with the KV it travels with.",
    "PD_STRATEGY_UNSUPPORTED": "A radix-cache strategy SGLang does not support under PD disaggregation.",
    "PORT_CONFLICT": "Two servers (or the bootstrap) on one port under PD.",
    "ELASTIC_SPEC_UNSUPPORTED": "The elastic pool with a speculative algorithm or draft tree it cannot run.",
    "ELASTIC_PD_SPEC": "The elastic pool with PD and speculative decoding over Mooncake (unsupported).",
    "BUILTIN_UNSUPPORTED": "A feature or policy the bundled runtime does not implement.",
    "BUILTIN_REFUSES": "The bundled runtime's own argument parser refuses the command launch would start.",
    "MODEL_PATH_MISSING": "server.model_path is empty: nothing to serve.",
    "MODEL_PATH_NOT_FOUND": "server.model_path names nothing the engine can load (or a hub id on the runtime).",
    "HOST_INVALID": "server.host is empty, too long or not an address: an error.",
    "HOST_EXPOSED": "server.host listens beyond this machine and the server has no key: a warning.",
    "MULTINODE": "nnodes > 1 without dist_init_addr, or node_rank not below nnodes.",
    "UNKNOWN_ENGINE_FLAG": "An [extra_engine_args] flag the engine does not have (or renamed).",
    "ENGINE_FLAG_VALUE": "An [extra_engine_args] value the flag does not accept.",
    # the target SGLang release (hybridctl/rules/release_rules.py; --sglang-version, installed, server.sglang_version)
    "SGLANG_RELEASE_VALUE": "A value the target SGLang release's flag does not accept (fix: a value it does).",
    "SGLANG_RELEASE_KEY": "A key only newer SGLang releases have a flag for (fix: its default, or >= that release).",
    "SGLANG_RELEASE_FLAG": "A flag the target SGLang release's parser does not have.",
    "SGLANG_RELEASE_CHANGES": "A setting the target SGLang release silently changes at start-up (warning).",
    "SGLANG_RELEASE_UNCHECKED": "hybridctl holds no flag table for the target release; the nearest older was used.",
    "ENGINE_FLAG_SHADOWS_KEY": "An [extra_engine_args] flag that a config key already sets.",
    "ENGINE_VERSION_UNKNOWN": "No flag table for the requested engine version; the nearest one was used.",
}


CONFIG = "config.toml"
SETTINGS = "settings.json"


def rule_finding(severity: Severity, code: str, file: str, key: str, message: str, fix: str) -> Finding:
    """A rule's finding: no line yet, `check_files` locates the key in the real file."""
    return Finding(severity, code, file, None, None, key, message, fix)


def toml_set(key: str, value: str) -> str:
    """`set key = value in [section] of config.toml` for a dotted key."""
    section, name = key.rsplit(".", 1)
    return f"set {name} = {value} in [{section}] of {CONFIG}"


def json_set(key: str, value: str) -> str:
    """`set "key": value in the "section" object of settings.json` for a dotted key."""
    section, name = key.rsplit(".", 1)
    return f'set "{name}": {value} in the "{section}" object of {SETTINGS}'
