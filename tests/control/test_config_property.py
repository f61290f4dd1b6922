"""Property: any damage to valid files gives a HybridConfig or ConfigError/Findings, never a traceback."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import tomlkit
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hybridctl.config.findings import Finding, ValidationReport
from hybridctl.config.loader import ConfigError, load_hybrid_config
from hybridctl.config.schema import HybridConfig
from hybridctl.rules.check import check_files

BASE = HybridConfig()
BASE.config.server.model_path = "/models/qwen3-next"
BASE.config.extra_engine_args = {"mamba-backend": "triton"}
BASE.settings.api.api_key_env = "OPENAI_API_KEY"


def base_config() -> dict[str, Any]:
    return BASE.config.model_dump(exclude_none=True)


def base_settings() -> dict[str, Any]:
    return BASE.settings.model_dump(mode="json")


scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.booleans(),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
out_of_range = st.sampled_from([0, -1, -(2**40), 2**40, 65536, 1.5, 1e308, -0.0])


def paths_of(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in data.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += paths_of(value, (*prefix, key))
    return out


@st.composite
def mutated(draw: st.DrawFn, data: dict[str, Any]) -> dict[str, Any]:
    """1-4 random mutations: delete a key, set a wrong-typed or out-of-range value, add an unknown key."""
    data = json.loads(json.dumps(data, allow_nan=True))
    for _ in range(draw(st.integers(1, 4))):
        paths = paths_of(data)
        kind = draw(st.sampled_from(["delete", "wrong", "range", "unknown"]))
        if not paths:
            kind = "unknown"
        if kind == "unknown":
            parent = draw(st.sampled_from([(), *[p for p in paths if isinstance(get(data, p), dict)]]))
            get(data, parent)[draw(st.text(min_size=1, max_size=12))] = draw(values)
            continue
        path = draw(st.sampled_from(paths))
        container = get(data, path[:-1])
        if kind == "delete":
            del container[path[-1]]
        elif kind == "wrong":
            container[path[-1]] = draw(values)
        else:
            container[path[-1]] = draw(out_of_range)
    return data


def get(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def check(config_bytes: bytes, settings_bytes: bytes | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cpath, spath = Path(tmp) / "config.toml", Path(tmp) / "settings.json"
        cpath.write_bytes(config_bytes)
        if settings_bytes is not None:
            spath.write_bytes(settings_bytes)
        report = check_files(cpath, spath)
        assert isinstance(report, ValidationReport)
        for finding in report.findings:
            assert isinstance(finding, Finding)
            assert finding.severity in ("error", "warning", "info") and finding.code and finding.message
            assert finding.line is None or finding.line >= 1
            assert finding.fix or finding.severity == "info"
            str(finding)
        try:
            cfg = load_hybrid_config(cpath, spath)
        except ConfigError as exc:
            assert exc.findings and str(exc)
            assert not report.ok
        else:
            assert isinstance(cfg, HybridConfig)
            assert report.config == cfg
            assert not any(f.code in ("TOML_SYNTAX", "JSON_SYNTAX", "UNKNOWN_KEY") for f in report.findings)


def dump_toml(data: dict[str, Any]) -> bytes:
    try:
        return tomlkit.dumps(data).encode("utf-8", "surrogatepass")
    except Exception:  # noqa: BLE001  (some generated values have no TOML form: not our input to judge)
        assume(False)
        raise


@settings(max_examples=60, deadline=None)
@given(mutated(base_config()))
def test_mutated_config_toml(data: dict[str, Any]) -> None:
    check(dump_toml(data), json.dumps(base_settings()).encode())


@settings(max_examples=60, deadline=None)
@given(mutated(base_settings()))
def test_mutated_settings_json(data: dict[str, Any]) -> None:
    check(dump_toml(base_config()), json.dumps(data, allow_nan=True).encode("utf-8", "surrogatepass"))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_broken_syntax(data: st.DataObject) -> None:
    """Insert, delete or replace characters anywhere in valid text."""
    texts = [dump_toml(base_config()).decode(), json.dumps(base_settings(), indent=2)]
    which = data.draw(st.integers(0, 1))
    text = texts[which]
    pos = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 5))
    junk = data.draw(st.text(alphabet="[]{}\"=,:#\n\\ .'x0-", max_size=4))
    texts[which] = text[:pos] + junk + text[pos + cut :]
    check(texts[0].encode(), texts[1].encode())


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=200), st.one_of(st.none(), st.binary(max_size=200)))
def test_random_bytes(config_bytes: bytes, settings_bytes: bytes | None) -> None:
    check(config_bytes, settings_bytes)
