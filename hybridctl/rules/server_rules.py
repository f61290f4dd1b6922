"""SERVER_*: what `launch` and the engines refuse about [server] — the model to serve, the address, the nodes.

These run in `validate` (and `doctor`, and `launch` before anything starts) so a config `validate` calls valid
is one `launch --dry-run` and the bundled runtime's start-up checks accept. `check_multinode` raises for the
launch builders; `rule_server` reports the same conditions as findings.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from hybridctl.config.findings import CONFIG, Finding, toml_set
from hybridctl.config.findings import rule_finding as _f
from hybridctl.config.schema import HybridConfig
from hybridctl.launch.command import multinode_problem
from hybridctl.model.bundled import match_bundled
from hybridshared import paths

# RFC 1123: a host name is at most 253 characters of dot-separated labels of letters, digits and hyphens.
MAX_HOST_CHARS = 253
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
# A hub id: "org/name" (SGLang downloads it; the bundled runtime loads local directories only).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def host_problem(host: str) -> str | None:
    """Why `host` cannot be bound (empty, too long, not a name or an IP address), or None."""
    if not host.strip():
        return 'it is empty, which binds every interface (as "0.0.0.0" would) and hides that choice'
    if len(host) > MAX_HOST_CHARS:
        return f"it is {len(host)} characters long; host names have at most {MAX_HOST_CHARS}"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if all(_LABEL.match(label) for label in host.rstrip(".").split(".")):
        return None
    return "it is neither an IP address nor a host name (letters, digits, hyphens and dots)"


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost answer only this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_hub_id(model_path: str) -> bool:
    """`org/name` that names nothing on disk: a model SGLang would download."""
    return bool(_HUB_ID.match(model_path)) and not paths.exists(model_path)


def _not_found(message: str, fix: str) -> Finding:
    return _f("error", "MODEL_PATH_NOT_FOUND", CONFIG, "server.model_path", message, fix)


def _model_path_findings(cfg: HybridConfig, engine: str | None) -> list[Finding]:
    path = cfg.config.server.model_path
    if not path.strip():
        return [
            _f(
                "error",
                "MODEL_PATH_MISSING",
                CONFIG,
                "server.model_path",
                "model_path is empty (or [server] is missing), so there is nothing to serve.",
                toml_set("server.model_path", '"/path/to/model"')
                + " (a directory with config.json and safetensors, or a hub id for SGLang)",
            )
        ]
    p = Path(path).expanduser()
    if problem := paths.lookup_problem(p):
        return [
            _not_found(
                f"model_path {path!r} cannot be looked up: {problem}.",
                toml_set("server.model_path", '"/path/to/model"')
                + " (an existing model directory, or an org/name hub id)",
            )
        ]
    if paths.is_dir(p):
        if paths.is_file(p / "config.json"):
            return []
        return [
            _not_found(
                f"model_path {path!r} is a directory without config.json, which no engine can load.",
                toml_set("server.model_path", '"/path/to/model"') + " (the directory that holds config.json)",
            )
        ]
    if paths.is_file(p):
        return [
            _not_found(
                f"model_path {path!r} is a file; engines load a model directory (config.json + weights).",
                toml_set("server.model_path", f'"{p.parent}"') + " (the directory that holds it)",
            )
        ]
    if is_hub_id(path):
        if engine == "builtin":
            return [
                _not_found(
                    f"model_path {path!r} is a hub id, and the bundled runtime (engine builtin here) loads "
                    "local directories only.",
                    f"download it (huggingface-cli download {path} --local-dir DIR) and "
                    + toml_set("server.model_path", '"DIR"')
                    + ', or set engine = "sglang" in [server] on a GPU host',
                )
            ]
        return []  # SGLang downloads it at start-up
    bundled = match_bundled(path)
    if bundled is not None and engine != "builtin":
        # A config written on another machine for the GPU server that holds the model: checked and sized with
        # hybridctl's bundled config.json for that checkpoint; only the server can say whether the path is right.
        return [
            _f(
                "warning",
                "MODEL_PATH_NOT_FOUND",
                CONFIG,
                "server.model_path",
                f"model_path {path!r} does not exist on this host; the config is checked with hybridctl's "
                f"bundled config.json for {bundled.name}, and the server that runs it must hold the model there.",
                "launch on the server that holds the model, or "
                + toml_set("server.model_path", '"/path/to/model"')
                + " (a model directory here, or an org/name hub id)",
            )
        ]
    return [
        _not_found(
            f"model_path {path!r} does not exist (relative paths are read next to config.toml).",
            toml_set("server.model_path", '"/path/to/model"') + " (an existing model directory, or an org/name hub id)",
        )
    ]


def _other_path_findings(cfg: HybridConfig, engine: str | None) -> list[Finding]:
    """tokenizer_path and the draft model: a directory that exists, or (SGLang only) a hub id."""
    out = []
    for key, value in (
        ("server.tokenizer_path", cfg.config.server.tokenizer_path),
        ("speculative.speculative_draft_model_path", cfg.config.speculative.speculative_draft_model_path),
    ):
        if not value or paths.is_dir(Path(value).expanduser()):
            continue
        if is_hub_id(value) and engine != "builtin":
            continue
        problem = paths.lookup_problem(Path(value).expanduser())
        where = (
            f"cannot be looked up: {problem}"
            if problem
            else "is a hub id, and the bundled runtime loads local directories only"
            if is_hub_id(value)
            else ("is not a directory (relative paths are read next to config.toml)")
        )
        out.append(
            _f(
                "error",
                "MODEL_PATH_NOT_FOUND",
                CONFIG,
                key,
                f"{key.split('.')[-1]} {value!r} {where}.",
                toml_set(key, '"/path/to/dir"') + " (an existing directory), or remove it",
            )
        )
    return out


def _host_findings(cfg: HybridConfig) -> list[Finding]:
    host = cfg.config.server.host
    problem = host_problem(host)
    if problem:
        shown = host if len(host) <= 40 else host[:37] + "..."
        return [
            _f(
                "error",
                "HOST_INVALID",
                CONFIG,
                "server.host",
                f"host {shown!r} cannot be bound: {problem}.",
                toml_set("server.host", '"127.0.0.1"') + ' (this machine only), or "0.0.0.0" to expose it on purpose',
            )
        ]
    if is_loopback(host) or (cfg.config.server.api_key_env and cfg.config.server.engine == "builtin"):
        return []  # loopback only, or the bundled runtime requires the key named by server.api_key_env
    return [
        _f(
            "warning",
            "HOST_EXPOSED",
            CONFIG,
            "server.host",
            f"host {host!r} listens beyond this machine and the server requires no key (server.api_key_env "
            "is unset, or SGLang serves, which hybridctl never gives a key on its command line): anyone who "
            "reaches the port can use the model.",
            toml_set("server.host", '"127.0.0.1"')
            + ', or keep it and set api_key_env = "NAME" in [server] (the bundled runtime then requires that key), '
            "or put an authenticating proxy or a firewall in front of the port",
        )
    ]


def rule_server(cfg: HybridConfig, engine: str | None = None) -> list[Finding]:
    """MODEL_PATH_*, HOST_*, MULTINODE: the [server] settings launch and the engines refuse or warn about."""
    out = _model_path_findings(cfg, engine) + _other_path_findings(cfg, engine) + _host_findings(cfg)
    multinode = multinode_problem(cfg)
    if multinode is not None:
        key, message, fix = multinode
        out.append(_f("error", "MULTINODE", CONFIG, key, message, fix))
    return out
