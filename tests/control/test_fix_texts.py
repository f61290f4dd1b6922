"""Every fix names something that exists: each `--flag` a message names is a flag of the command it is addressed
to, and each `section.key` is a key of config.toml or settings.json (and each repository file it names exists).

The texts come from two places: the source (every message string in hybridctl/, found by walking its syntax
trees: findings' fixes, the doctor's remedies, planner and launch errors, validation messages) and the CLI itself
(the fixes `validate`, `doctor` and `plan` print for the test data's configs and logs). A flag is addressed to:
- the hybridctl command a text names next to it ("hybridctl plan --x", "`init --x`", "--x of plan and init");
- SGLang when the clause names SGLang ("SGLang's --x", "(SGLang: --x)"): the flag tables of every held release;
- the bundled runtime when it names the runtime ("the runtime's --x"): hybridshared/flags/runtime_parser.py's parser;
- the engine when it names the server's flags or command line: SGLang's or the runtime's;
- otherwise every command that prints the text (MODULE_COMMANDS).
A text that starts with a flag ("--trials must be >= 2") is that flag's own validation message: the flag must
exist on one of those commands.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from hybridctl.cli import app
from hybridctl.config.schema import ConfigToml, SettingsJson
from hybridshared.flags.engine_flags import available_versions, sglang_flags

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "hybridctl"
SHARED = REPO / "hybridshared"  # the shared layer: its texts reach users through hybridctl's commands too
DATA = Path(__file__).parent / "data"

ANY = ("*",)  # a flag of any hybridctl command or either engine
OTHER = ("-",)  # another program's flags: not checked
# Who prints the texts of each module (longest prefix wins). Verify's client is also doctor --url's and bench's.
MODULE_COMMANDS: dict[str, tuple[str, ...]] = {
    "bench/": ("bench",),
    "cli/bench_cmd.py": ("bench",),
    "cli/doctor_cmd.py": ("doctor",),
    "cli/init_cmd.py": ("init",),
    "cli/launch_cmd.py": ("launch",),
    "cli/plan_cmd.py": ("plan",),
    "cli/schema_cmd.py": ("schema",),
    "cli/validate_cmd.py": ("validate",),
    "cli/demo_cmd.py": ("demo",),
    "cli/config_args.py": ("validate", "plan", "launch", "doctor"),
    "cli/verify_cmd.py": ("verify",),
    "config/atomic_write.py": ("init", "schema", "launch"),
    "init/": ("init",),
    "rules/": ("validate", "plan", "launch", "doctor", "init"),  # init runs validate's checks on what it writes
    "config/docs_table.py": ("validate",),  # `schema --docs` writes validate's reference
    "config/schema.py": ANY,  # key descriptions (templates, JSON Schema, docs): any command's flag
    "config/": ("validate", "plan", "launch", "doctor", "init"),  # init runs validate's checks on what it writes
    "demo/": ("demo",),
    "doctor/": ("doctor",),
    "host/": ("doctor",),
    "launch/": ("launch",),
    "logs/": ("doctor", "launch"),
    "model/": ("plan", "init", "doctor"),
    "templates.py": ("init",),
    "hybridshared/model/": ("plan", "init", "doctor"),
    "hybridshared/sizing/": ("plan", "init", "doctor"),
    "hybridshared/units.py": ("plan", "init", "doctor"),
    "hybridshared/flags/": ("validate", "plan", "launch", "doctor", "init"),
    "hybridshared/compiler.py": ("doctor",),
    "hybridshared/paths.py": ("init",),
    "planner/": ("plan", "init", "doctor"),
    "planner/plan_request.py": ("plan",),
    "planner/recommend.py": ("init",),
    "verify/client.py": ("verify", "bench", "doctor"),
    "verify/runner.py": ("verify", "bench", "doctor"),
    "verify/basic.py": ("verify basic", "verify all"),
    "verify/prefix_judge.py": ("verify prefix-cache", "verify all"),
    "verify/prefix_cache.py": ("verify prefix-cache", "verify all"),
    "verify/spec.py": ("verify spec", "verify all"),
    "verify/structured.py": ("verify structured",),
    "verify/upstream.py": ("verify upstream",),
    "verify/": ("verify",),
}
# Modules whose strings are data, not messages: the key -> flag table and the flag lists generated from it.
DATA_MODULES = ("launch/mapping.py", "launch/mapping_doc.py", "launch/builtin_flags.py", "doctor/log_patterns.py")
# `python -m hybridctl.launch.pd_router`'s and `python -m runtime`'s own usage messages: their argparse flags, not a
# hybridctl command's.
OTHER_MODULES = (
    "launch/pd_router.py",
    "hybridshared/flags/runtime_args.py",
    "hybridshared/flags/runtime_parser.py",
    "hybridshared/flags/fields.py",
)
PLACEHOLDERS = {"--name"}  # "passed through as --name value": any flag

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
CLAUSE_END = re.compile(r"\.\s|;\s|\n|[Ff]ix: |\{\} (?=[A-Z])")  # "{}" may end a sentence


@functools.cache
def command_flags() -> dict[str, frozenset[str]]:
    """hybridctl command (verify subcommands as "verify NAME") -> its option names, from click's view of the app."""
    group = typer.main.get_command(app)
    out: dict[str, frozenset[str]] = {}
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        subs = getattr(cmd, "commands", None)
        for sub_name, sub in (subs or {name: cmd}).items():
            key = f"{name} {sub_name}" if subs else name
            out[key] = frozenset(o for p in sub.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--"))
    return out


def flags_of(command: str) -> list[frozenset[str]]:
    """One set per command `command` stands for ("verify": each of its subcommands)."""
    table = command_flags()
    if command in table:
        return [table[command]]
    subs = [v for k, v in table.items() if k.startswith(command + " ")]
    assert subs, f"no hybridctl command {command!r}"
    return subs


@functools.cache
def sglang_all() -> frozenset[str]:
    """Every flag (aliases too) of every SGLang release hybridctl holds a table for."""
    names: set[str] = set()
    for version in available_versions():
        for info in sglang_flags(version).values():
            names.update((info.name, *info.aliases))
    return frozenset(names)


@functools.cache
def runtime_flags() -> frozenset[str]:
    from hybridshared.flags.runtime_parser import build_parser  # torch-free by design (hybridctl validate runs it)

    return frozenset(o for a in build_parser()._actions for o in a.option_strings)


@functools.cache
def schema_keys() -> dict[str, frozenset[str]]:
    """section -> its keys, for both files (no section is in both)."""
    out: dict[str, frozenset[str]] = {}
    for model in (ConfigToml, SettingsJson):
        for section, field in model.model_fields.items():
            sub = field.annotation
            out[section] = frozenset(getattr(sub, "model_fields", {}))
    return out


# --- addressees ----------------------------------------------------------------------------------------------

COMMANDS = ("init", "validate", "plan", "schema", "launch", "status", "stop", "bench", "doctor", "demo", "verify")
_CMD = "|".join(COMMANDS)
# A marker addresses the flags after it in its clause; the last one before a flag wins.
MARKERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"hybridctl ({_CMD})(?: (basic|prefix-cache|spec|structured|upstream|all))?\b"), "cmd"),
    (re.compile(rf"`({_CMD})\b()"), "cmd"),
    (re.compile(rf"(?<![\w/.-])({_CMD})() (?=--)"), "cmd"),
    (re.compile(r"SGLang(?: [\d.{}]+)?(?:'s|:| has no)|on SGLang|\(SGLang|launch_server|sglang --"), "sglang"),
    (re.compile(r"runtime's|(?:bundled|the) runtime:|python -m runtime\b"), "runtime"),
    (re.compile(r"server's|'s command line"), "engine"),
    (re.compile(r"pip install|huggingface-cli|python -m hybridctl\.launch\.mapping_doc"), "other"),
    (re.compile(r"(?<![\w/.-])((?:benchmarks|scripts)/[\w/-]+\.py)()"), "script"),  # its own argparse flags
]
AFTER = re.compile(rf"^(?: \S+)? (?:of|to) ((?:{_CMD})(?:(?:, | and | or )(?:{_CMD}))*)\b")
REPO_FILE = r"(?<![\w/.-])((?:scripts|benchmarks|runtime|docs|hybridctl|templates)/[\w/.-]*\w\.(?:py|md|json|toml))"
ENGLISH = {"of", "is", "in", "on", "at", "or", "and", "to", "the", "a", "with", "from", "for", "as", "was"}


@dataclass(frozen=True)
class Text:
    where: str  # file:line, or the command line that printed it
    text: str
    commands: tuple[str, ...]  # who prints it


def _addressee(text: str, start: int, end: int, commands: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """(kind, commands) the flag at text[start:end] is addressed to."""
    if m := AFTER.match(text[end:]):
        return "cmd", tuple(re.split(r", | and | or ", m.group(1)))
    clause_start = max((m.end() for m in CLAUSE_END.finditer(text, 0, start)), default=0)
    best: tuple[int, str, tuple[str, ...]] | None = None
    for rx, kind in MARKERS:
        for m in rx.finditer(text, clause_start):
            if m.start() >= start:
                break
            names = ((f"{m.group(1)} {m.group(2)}" if m.group(2) else m.group(1)),) if kind in ("cmd", "script") else ()
            if best is None or m.start() >= best[0]:
                best = (m.start(), kind, names)
    if best is None:
        return "printer", commands
    return best[1], best[2]


def problems(t: Text) -> list[str]:
    out = []
    for m in FLAG.finditer(t.text):
        flag = m.group(0)
        kind, names = _addressee(t.text, m.start(), m.end(), t.commands)
        if kind == "other" or t.commands == OTHER or flag in PLACEHOLDERS:
            continue
        if kind == "printer" and t.commands == ANY:
            kind, names = "any", ()
        if kind == "any":
            tables = [*command_flags().values(), sglang_all(), runtime_flags()]
            if not any(flag in s for s in tables):
                out.append(f"{t.where}: {flag} is a flag of no hybridctl command nor engine: {t.text!r}")
            continue
        if kind == "script":
            script = REPO / names[0]
            ok, whose = script.exists() and f'"{flag}"' in script.read_text(), names[0]
        elif kind == "sglang":
            ok, whose = flag in sglang_all(), "SGLang (any held release)"
        elif kind == "runtime":
            ok, whose = flag in runtime_flags(), "the bundled runtime"
        elif kind == "engine":
            # The server a log or --url came from is one engine, and the text is spelled for it.
            ok, whose = flag in sglang_all() or flag in runtime_flags(), "either engine"
        else:
            own_validation = m.start() == 0 and kind == "printer"  # "--x must be ..." of the command taking --x
            sets = [s for c in names for s in flags_of(c)]
            ok = any(flag in s for s in sets) if own_validation else all(flag in s for s in sets)
            whose = f"hybridctl {'/'.join(names)}"
        if not ok:
            out.append(f"{t.where}: {flag} is not a flag of {whose}: {t.text!r}")
    for m in re.finditer(r"(?<![\w/.-])([a-z_]+)\.([a-z_]+)\b(?![./(-])", t.text):
        section, key = m.groups()
        keys = schema_keys()
        if section in keys and section != "extra_engine_args" and key not in keys[section]:
            out.append(f"{t.where}: {section}.{key} is not a key of either file: {t.text!r}")
    for m in re.finditer(r"\[([a-z_]+)\] ([a-z_]+)(?:/([a-z_]+))?", t.text):
        section, *names_ = m.groups()
        keys = schema_keys()
        for key in filter(None, names_):
            if key in ENGLISH:
                continue
            if section in keys and section != "extra_engine_args" and key not in keys[section]:
                out.append(f"{t.where}: [{section}] {key} is not a key of either file: {t.text!r}")
    for m in re.finditer(REPO_FILE, t.text):
        if not (REPO / m.group(1)).exists():
            out.append(f"{t.where}: {m.group(1)} does not exist in the repository: {t.text!r}")
    if "hybridctl launch" in t.text and re.search(r"relaunch|restart|again", t.text) and "stop" not in t.text:
        out.append(f"{t.where}: restarting through `hybridctl launch` alone, which refuses while it runs: {t.text!r}")
    return out


# --- texts from the source -----------------------------------------------------------------------------------


def _commands_for(rel: str) -> tuple[str, ...]:
    if rel.startswith(OTHER_MODULES):
        return OTHER
    best = max((p for p in MODULE_COMMANDS if rel.startswith(p)), key=len, default=None)
    assert best is not None, f"{rel}: add it to MODULE_COMMANDS (who prints its texts?)"
    return MODULE_COMMANDS[best]


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """Docstrings, help texts (a flag's own definition) and regular expressions: not messages."""
    out = _docstrings(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
        if name in ("compile", "search", "match", "sub", "finditer", "findall", "fullmatch"):
            out.update(id(n) for a in node.args for n in ast.walk(a))
        out.update(id(n) for k in node.keywords if k.arg == "help" for n in ast.walk(k.value))
    return out


def _render(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)  # type: ignore[misc]
    return None


def _sources() -> Iterator[tuple[Path, str]]:
    """(file, its name in MODULE_COMMANDS): hybridctl's relative to the package, the shared layer's with its own."""
    yield from ((p, p.relative_to(PACKAGE).as_posix()) for p in sorted(PACKAGE.rglob("*.py")))
    yield from ((p, p.relative_to(REPO).as_posix()) for p in sorted(SHARED.rglob("*.py")))


def source_texts() -> Iterator[Text]:
    for path, rel in _sources():
        if rel.startswith(DATA_MODULES) or rel in ("__init__.py", "__main__.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _skipped_nodes(tree)
        parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            text = _render(node)
            if text is None or id(node) in skipped or id(node) in parts or " " not in text.strip():
                continue
            if FLAG.search(text) or re.search(r"[a-z_]+\.[a-z_]+|\[[a-z_]+\] ", text):
                where = rel if rel.startswith("hybridshared/") else f"hybridctl/{rel}"
                yield Text(f"{where}:{node.lineno}", text, _commands_for(rel))  # type: ignore[attr-defined]


DOTTED = re.compile(r"^(?!settings\.json$|config\.toml$)[a-z_]+\.[a-z_-]+$")  # a key, not a file name


def _keys_in_calls() -> Iterator[tuple[str, str, str]]:
    """(where, file, dotted key) for every call or tuple that names a config key as literals: toml_set("memory.x",
    ...), json_set(...), Change("config.toml", "memory.x", ...), the remedies' _simple(...) and candidates."""
    for path, _ in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Tuple):  # the remedies' ("config.toml", "memory.x", values) candidates
                elts = [e.value if isinstance(e, ast.Constant) else None for e in node.elts[:2]]
                file, key = (elts[0], elts[1]) if len(elts) == 2 else (None, None)
                if file in ("config.toml", "settings.json") and isinstance(key, str) and DOTTED.match(key):
                    yield where, str(file), key
                continue
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
            if name in ("toml_set", "json_set") and args and isinstance(args[0], str):
                yield where, "config.toml" if name == "toml_set" else "settings.json", args[0]
            elif len(args) >= 2 and args[0] in ("config.toml", "settings.json") and isinstance(args[1], str):
                if DOTTED.match(args[1]):
                    yield where, args[0], args[1]


# --- texts the CLI prints ------------------------------------------------------------------------------------


def _hybridctl(*args: str, cwd: Path, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "hybridctl", *args], capture_output=True, text=True, cwd=cwd, timeout=300,
        input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
    )  # fmt: skip
    return proc.stdout + proc.stderr


def printed_texts(tmp_path: Path) -> Iterator[Text]:
    """Fixes the CLI prints: validate and doctor on the article's files, doctor on every corpus log, plan of a
    model that does not fit the runtime's memory."""
    article = DATA / "article-files"
    for command in (("validate", "--json"), ("doctor", "--no-host", "--json")):
        out = _json_of(_hybridctl(*command, str(article / "config.toml"), cwd=tmp_path))
        for f in out["findings"]:
            yield Text(f"{' '.join(command)} (article)", f["fix"], (command[0],))
    logs = sorted((DATA / "logs").glob("*.log")) + sorted((DATA / "doctor_logs").glob("*.log"))
    assert len(logs) > 40
    for log in logs:  # in-process: one interpreter per log would take minutes
        res = CliRunner().invoke(app, ["doctor", "--no-host", "--json", "--log", str(log)])
        for f in _json_of(res.stdout)["findings"]:
            yield Text(f"doctor --log {log.name}", f["fix"], ("doctor",))
    model = tmp_path / "model"
    model.mkdir()
    qwen = (REPO / "templates" / "models" / "qwen3-next-80b-a3b.json").read_text(encoding="utf-8")
    (model / "config.json").write_text(qwen, encoding="utf-8")
    config = tmp_path / "config.toml"
    config.write_text(f'[server]\nmodel_path = {json.dumps(str(model))}\nengine = "builtin"\n')
    out = _json_of(_hybridctl("plan", str(config), "--json", cwd=tmp_path))
    assert out["fits"] is False, out  # 80B of weights in the runtime's default 4 GiB
    yield Text("plan (builtin, too small)", out["error"], ("plan",))


def _json_of(output: str) -> dict[str, Any]:
    start = output.index("{")
    obj, _ = json.JSONDecoder().raw_decode(output[start:])
    assert isinstance(obj, dict)
    return obj


# --- the tests -----------------------------------------------------------------------------------------------


def test_every_source_text_names_real_flags_and_keys() -> None:
    texts = list(source_texts())
    assert len(texts) > 150  # the walk finds the messages (a broken walk would pass vacuously)
    bad = [p for t in texts for p in problems(t)]
    assert not bad, "\n".join(bad)


def test_every_literal_key_a_fix_sets_exists_in_its_file() -> None:
    config_sections, settings_sections = set(ConfigToml.model_fields), set(SettingsJson.model_fields)
    found = list(_keys_in_calls())
    assert len(found) > 20
    bad = []
    for where, file, dotted in found:
        section, _, key = dotted.partition(".")
        sections = config_sections if file == "config.toml" else settings_sections
        if section not in sections or (section != "extra_engine_args" and key not in schema_keys()[section]):
            bad.append(f"{where}: {dotted} is not a key of {file}")
    assert not bad, "\n".join(bad)


def test_every_printed_fix_names_real_flags_and_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the in-process doctor runs must not find a ./config.toml
    texts = list(printed_texts(tmp_path))
    assert len(texts) > 40
    bad = [p for t in texts for p in problems(t)]
    assert not bad, "\n".join(bad)
