"""Run checks against one server: resolve the URL (--url, else config.toml [server]), the API key (from a named
environment variable), and turn "cannot connect" into `ServerUnreachable` before any check starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from hybridctl.config.loader import load_hybrid_config, settings_path_for
from hybridctl.config.schema import HybridConfig
from hybridctl.verify.basic import run_basic
from hybridctl.verify.client import ServerError, SGLangClient, Target
from hybridctl.verify.prefix_cache import run_prefix_cache
from hybridctl.verify.prefix_judge import PrefixCacheOptions
from hybridctl.verify.report import CheckResult, VerifyReport
from hybridctl.verify.spec import SpecOptions, run_spec
from hybridctl.verify.structured import StructuredOptions, run_structured
from hybridctl.verify.upstream import UpstreamOptions, run_upstream

CHECK_NAMES = ("basic", "prefix-cache", "spec", "structured")


class TargetError(ValueError):
    """The target cannot be determined (no URL, unset API-key variable): a usage problem, exit code 2."""


@dataclass
class VerifyOptions:
    prefix_cache: PrefixCacheOptions = field(default_factory=PrefixCacheOptions)
    spec: SpecOptions = field(default_factory=SpecOptions)
    structured: StructuredOptions = field(default_factory=StructuredOptions)


def url_from_config(config: HybridConfig) -> str:
    host = config.config.server.host
    # A server bound to every interface is reached on loopback from this host.
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{config.config.server.port}"


def resolve_target(
    url: str | None, config: HybridConfig | None, api_key_env: str | None, timeout_s: float = 300.0
) -> Target:
    if url is None:
        if config is None:
            raise TargetError(
                "no server address: pass --url http://HOST:PORT, or --config config.toml whose "
                "[server] host/port name the server"
            )
        url = url_from_config(config)
    if not url.startswith(("http://", "https://")) or not _has_host(url):
        raise TargetError(f"--url {url!r} is not an http(s) URL; write it like http://127.0.0.1:30000")
    key = None
    if api_key_env is None and config is not None and config.config.server.api_key_env:
        # The variable `hybridctl launch` gave the server (--api-key-env): the same config finds the same key
        # (unset: no key, e.g. an SGLang server, which hybridctl starts without one).
        key = os.environ.get(config.config.server.api_key_env) or None
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise TargetError(
                f"--api-key-env names {api_key_env}, but that environment variable is unset or "
                f"empty; export {api_key_env}=<key> first (the key itself never goes on the command line)"
            )
    if key is not None and not (key.isascii() and key.isprintable()):
        # An HTTP header carries printable ASCII; anything else fails inside the client on the first request.
        variable = api_key_env or config.config.server.api_key_env if config is not None else api_key_env
        raise TargetError(
            f"the API key in ${variable} holds characters an HTTP Authorization header cannot carry (non-ASCII or "
            f"control characters); export {variable}=<the key as the server was given it>"
        )
    return Target(url=url.rstrip("/"), api_key=key, timeout_s=timeout_s)


def _has_host(url: str) -> bool:

    try:
        host = httpx.URL(url).host
        # What the resolver does with the name: a label over 63 characters (or a name over 253) cannot be
        # looked up, and would surface as a UnicodeError from deep inside the connection.
        host.encode("idna")
    except (httpx.InvalidURL, UnicodeError):  # e.g. an unclosed IPv6 bracket or a port that is not a number
        return False
    return bool(host)


def load_config(config_path: str | None, settings_path: str | None) -> HybridConfig | None:
    """The config files if given (else ./config.toml if present), relative model paths resolved."""

    if config_path is None:
        if not Path("config.toml").is_file():
            return None
        config_path = "config.toml"
    return load_hybrid_config(config_path, settings_path_for(config_path, settings_path))


def run_checks(
    target: Target,
    config: HybridConfig | None,
    names: tuple[str, ...] = CHECK_NAMES,
    options: VerifyOptions | None = None,
    on_check: Callable[[str], None] | None = None,
) -> VerifyReport:
    """Run the named checks in order. Raises ServerUnreachable if the server does not answer at all."""
    opts = options or VerifyOptions()
    report = VerifyReport(url=target.url)
    with SGLangClient(target) as client:
        client.health()  # raises ServerUnreachable before any check runs
        for name in names:
            if on_check is not None:
                on_check(name)
            report.checks.append(_run_one(client, config, name, opts))
    return report


def _run_one(client: SGLangClient, config: HybridConfig | None, name: str, opts: VerifyOptions) -> CheckResult:

    try:
        if name == "basic":
            return run_basic(client, config)
        if name == "prefix-cache":
            return run_prefix_cache(client, config, opts.prefix_cache)
        if name == "spec":
            return run_spec(client, config, opts.spec)
        if name == "structured":
            return run_structured(client, opts.structured)
    except ServerError as exc:
        reason = f"the server gave an unusable answer: {exc}"
        return CheckResult(name, "failed", reason, [reason])
    raise ValueError(f"unknown check {name!r}; known: {', '.join(CHECK_NAMES)}")


def resolve_gateway(config: HybridConfig | None) -> Target:
    """settings.json's `api` section as a target: base_url, the key from the variable api_key_env names (never
    the key itself), timeout_seconds."""
    api = config.settings.api if config is not None else None
    if api is None or not api.base_url:
        raise TargetError(
            'verify upstream needs the gateway: set "api": {"base_url": "https://HOST/v1", "api_key_env": "NAME"} '
            "in settings.json (next to config.toml, or pass --settings)"
        )
    if not api.base_url.startswith(("http://", "https://")) or not _has_host(api.base_url):
        raise TargetError(f"settings.json api.base_url {api.base_url!r} is not an http(s) URL")
    key = None
    if api.api_key_env:
        key = os.environ.get(api.api_key_env)
        if not key:
            raise TargetError(
                f"settings.json api.api_key_env names {api.api_key_env}, but that environment variable is unset "
                f"or empty; export {api.api_key_env}=<the gateway's key> first"
            )
    return Target(url=api.base_url.rstrip("/"), api_key=key, timeout_s=api.timeout_seconds)


def run_upstream_check(local: Target, gateway: Target, options: UpstreamOptions) -> VerifyReport:
    """The local server (its OpenAI routes under /v1) and the gateway, side by side; raises ServerUnreachable
    when either does not answer at all."""
    openai_local = Target(url=local.url + "/v1", api_key=local.api_key, timeout_s=local.timeout_s)
    report = VerifyReport(url=local.url)
    report.checks.append(run_upstream(openai_local, gateway, options))
    return report
