"""`hybridctl verify {all,basic,prefix-cache,spec,structured,upstream}`: check a running server against its config.

Exit codes: 0 every check that ran passed (skipped ones do not count), 1 a check failed, 2 the server cannot be reached
or the target/config cannot be determined.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from hybridctl.cli.app import app
from hybridctl.cli.config_args import API_KEY_ENV_OPT, NO_FILES, URL_OPT, ConfigFiles, json_option, takes_config_files
from hybridctl.cli.output import fail, print_json

if TYPE_CHECKING:
    from hybridctl.verify.runner import VerifyOptions

verify_app = typer.Typer(
    help="Check a running server: it answers, prefix caching works, speculative decoding accepts drafts, "
    "structured output is valid.",
    no_args_is_help=True,
    rich_markup_mode=None,  # as the main app: help texts are plain text
)
app.add_typer(verify_app, name="verify")


def _execute(
    names: tuple[str, ...],
    url: str | None,
    files: ConfigFiles,
    api_key_env: str | None,
    as_json: bool,
    options: VerifyOptions,
) -> None:
    from rich.console import Console

    from hybridctl.config.findings import ConfigError
    from hybridctl.verify.client import ServerError, ServerUnreachable
    from hybridctl.verify.prefix_judge import OptionsError
    from hybridctl.verify.render import render_report
    from hybridctl.verify.report import unreachable_report
    from hybridctl.verify.runner import TargetError, load_config, resolve_target, run_checks
    from hybridctl.verify.structured import SchemaFileError

    config_path, settings_path = files.config, files.settings  # None: ./config.toml when present
    err = Console(stderr=True)
    try:
        options.prefix_cache.validate()
        options.structured.validate()
        config = load_config(str(config_path) if config_path else None, str(settings_path) if settings_path else None)
        target = resolve_target(url, config, api_key_env)
    except (ConfigError, TargetError, OptionsError, SchemaFileError) as exc:
        raise fail(str(exc)) from None
    try:
        if as_json:
            report = run_checks(target, config, names, options)
        else:
            with err.status("verifying …") as status:
                report = run_checks(
                    target,
                    config,
                    names,
                    options,
                    on_check=lambda n: status.update(f"verify {n} against {target.url} …"),
                )
    except (ServerUnreachable, ServerError) as exc:  # ServerError: it answered, but not usably, before any check
        if as_json:
            print_json(unreachable_report(target.url, str(exc)))
        raise fail(str(exc)) from None
    if as_json:
        print_json(report.to_dict())
    else:
        render_report(report, Console())
    raise typer.Exit(0 if report.passed else 1)


def _options(**given: Any) -> VerifyOptions:
    """VerifyOptions from the flags a command has; the rest keep the library's defaults (the one copy of them)."""
    from hybridctl.verify.prefix_judge import PrefixCacheOptions
    from hybridctl.verify.runner import VerifyOptions
    from hybridctl.verify.spec import SpecOptions

    spec = {SPEC_FLAGS[k]: v for k, v in given.items() if k in SPEC_FLAGS}
    prefix = {k: v for k, v in given.items() if k not in SPEC_FLAGS}
    return VerifyOptions(prefix_cache=PrefixCacheOptions(**prefix), spec=SpecOptions(**spec))


# Parameter -> SpecOptions field; every other option parameter is a PrefixCacheOptions field of the same name.
SPEC_FLAGS = {"spec_requests": "requests", "min_accept_length": "min_accept_length"}

_DOC = typer.Option(2048, "--doc-tokens", help="Length of the shared document in tokens.")
_QTOKENS = typer.Option(24, "--question-tokens", help="Length of each question in tokens.")
_TRIALS = typer.Option(5, "--trials", help="Measured trials (each: flush, cold, warm requests).")
_WARMUP = typer.Option(2, "--warmup", help="Unmeasured warm-up requests before the trials.")
_QUESTIONS = typer.Option(2, "--questions", help="Different questions per document (the last one is judged).")
_REPEATS = typer.Option(2, "--repeats", help="Identical-prompt repeats per trial (the last one is judged).")
_MAX_RATIO = typer.Option(0.8, "--max-ratio", help="Pass when median warm TTFT / cold TTFT is at most this.")
_MIN_CACHED = typer.Option(0.9, "--min-cached-fraction", help="Pass when warm cached_tokens >= this x document.")
_MAX_NEW = typer.Option(4, "--max-new-tokens", help="Tokens generated per prefix-cache request.")
_SEED = typer.Option(0, "--seed", help="Seed for documents, questions and the bootstrap.")
_SPEC_REQ = typer.Option(4, "--spec-requests", min=1, help="Requests the spec check sends.")
_MIN_ACCEPT = typer.Option(
    1.5, "--min-accept-length", min=0.0, help="Pass when the mean accept length is at least this."
)


@verify_app.command("all")
@takes_config_files()
def verify_all(
    url: str | None = URL_OPT,
    files: ConfigFiles = NO_FILES,
    api_key_env: str | None = API_KEY_ENV_OPT,
    as_json: bool = json_option(),
    doc_tokens: int = _DOC,
    trials: int = _TRIALS,
    warmup: int = _WARMUP,
    max_ratio: float = _MAX_RATIO,
    min_cached_fraction: float = _MIN_CACHED,
    min_accept_length: float = _MIN_ACCEPT,
) -> None:
    """Run basic, prefix-cache and spec."""
    opts = _options(
        doc_tokens=doc_tokens,
        trials=trials,
        warmup=warmup,
        max_ratio=max_ratio,
        min_cached_fraction=min_cached_fraction,
        min_accept_length=min_accept_length,
    )
    _execute(("basic", "prefix-cache", "spec"), url, files, api_key_env, as_json, opts)


@verify_app.command("basic")
@takes_config_files()
def verify_basic(
    url: str | None = URL_OPT,
    files: ConfigFiles = NO_FILES,
    api_key_env: str | None = API_KEY_ENV_OPT,
    as_json: bool = json_option(),
) -> None:
    """The server answers, streaming works, /model_info and /server_info match the config."""
    _execute(("basic",), url, files, api_key_env, as_json, _options())


@verify_app.command("prefix-cache")
@takes_config_files()
def verify_prefix_cache(
    url: str | None = URL_OPT,
    files: ConfigFiles = NO_FILES,
    api_key_env: str | None = API_KEY_ENV_OPT,
    as_json: bool = json_option(),
    doc_tokens: int = _DOC,
    question_tokens: int = _QTOKENS,
    trials: int = _TRIALS,
    warmup: int = _WARMUP,
    questions: int = _QUESTIONS,
    repeats: int = _REPEATS,
    max_ratio: float = _MAX_RATIO,
    min_cached_fraction: float = _MIN_CACHED,
    max_new_tokens: int = _MAX_NEW,
    seed: int = _SEED,
) -> None:
    """Cold vs warm TTFT on a shared document; cached_tokens per request; /metrics hit rate."""
    opts = _options(
        doc_tokens=doc_tokens,
        question_tokens=question_tokens,
        trials=trials,
        warmup=warmup,
        questions=questions,
        repeats=repeats,
        max_ratio=max_ratio,
        min_cached_fraction=min_cached_fraction,
        max_new_tokens=max_new_tokens,
        seed=seed,
    )
    _execute(("prefix-cache",), url, files, api_key_env, as_json, opts)


@verify_app.command("spec")
@takes_config_files()
def verify_spec(
    url: str | None = URL_OPT,
    files: ConfigFiles = NO_FILES,
    api_key_env: str | None = API_KEY_ENV_OPT,
    as_json: bool = json_option(),
    spec_requests: int = _SPEC_REQ,
    min_accept_length: float = _MIN_ACCEPT,
) -> None:
    """Speculative decoding accept length vs the configured ceiling (skipped when the server has none)."""
    _execute(
        ("spec",),
        url,
        files,
        api_key_env,
        as_json,
        _options(spec_requests=spec_requests, min_accept_length=min_accept_length),
    )


_S_REQUESTS = typer.Option(20, "--requests", help="JSON-schema requests to send.")
_S_MAX_NEW = typer.Option(256, "--max-new-tokens", help="Token budget per answer (a cut answer is invalid).")
_S_TEMP = typer.Option(
    1.0, "--temperature", min=0.0, help="Sampling temperature (1.0: the grammar alone keeps it valid)."
)
_S_CONC = typer.Option(8, "--concurrency", help="Requests in flight at once.")
_S_RATE = typer.Option(1.0, "--min-valid-rate", help="Pass when at least this fraction of answers validate.")
_S_SCHEMA = typer.Option(None, "--schema", help="JSON schema file (default: a built-in record schema).")


@verify_app.command("structured")
@takes_config_files()
def verify_structured(
    url: str | None = URL_OPT,
    files: ConfigFiles = NO_FILES,
    api_key_env: str | None = API_KEY_ENV_OPT,
    as_json: bool = json_option(),
    requests: int = _S_REQUESTS,
    max_new_tokens: int = _S_MAX_NEW,
    temperature: float = _S_TEMP,
    concurrency: int = _S_CONC,
    min_valid_rate: float = _S_RATE,
    schema: Path | None = _S_SCHEMA,
) -> None:
    """JSON-schema constrained requests: the share of answers that parse and validate."""
    from hybridctl.verify.structured import SchemaFileError, StructuredOptions, load_schema

    opts = _options()
    opts.structured = StructuredOptions(
        requests=requests,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        concurrency=concurrency,
        min_valid_rate=min_valid_rate,
    )
    if schema is not None:
        try:
            opts.structured.schema = load_schema(schema)
        except SchemaFileError as exc:
            raise fail(str(exc)) from None
    _execute(("structured",), url, files, api_key_env, as_json, opts)


_PROMPTS = typer.Option(4, "--prompts", help="Prompts sent to both sides (1-8).")
_UP_MAX = typer.Option(16, "--max-tokens", help="Greedy tokens per answer.")
_SAME = typer.Option(False, "--same-weights", help="Both serve the same weights: fail unless greedy answers match.")
_UP_MODEL = typer.Option(None, "--upstream-model", help="Model name at the gateway (default: its first listed).")


@verify_app.command("upstream")
@takes_config_files()
def verify_upstream(
    url: str | None = URL_OPT,
    files: ConfigFiles = NO_FILES,
    api_key_env: str | None = API_KEY_ENV_OPT,
    as_json: bool = json_option(),
    prompts: int = _PROMPTS,
    max_tokens: int = _UP_MAX,
    same_weights: bool = _SAME,
    upstream_model: str | None = _UP_MODEL,
) -> None:
    """The same greedy prompts to this server and to settings.json's api gateway: answered, latency, agreement."""
    from rich.console import Console

    from hybridctl.config.findings import ConfigError
    from hybridctl.verify.client import ServerUnreachable
    from hybridctl.verify.render import render_report
    from hybridctl.verify.report import unreachable_report
    from hybridctl.verify.runner import TargetError, load_config, resolve_gateway, resolve_target, run_upstream_check
    from hybridctl.verify.upstream import UpstreamOptions

    options = UpstreamOptions(prompts, max_tokens, same_weights, upstream_model=upstream_model)
    config_path, settings_path = files.config, files.settings
    try:
        options.validate()
        loaded = load_config(str(config_path) if config_path else None, str(settings_path) if settings_path else None)
        target = resolve_target(url, loaded, api_key_env)
        gateway = resolve_gateway(loaded)
    except (ConfigError, TargetError, ValueError) as exc:
        raise fail(str(exc)) from None
    try:
        report = run_upstream_check(target, gateway, options)
    except ServerUnreachable as exc:
        if as_json:
            print_json(unreachable_report(target.url, str(exc)))
        raise fail(str(exc)) from None
    if as_json:
        print_json(report.to_dict())
    else:
        render_report(report, Console())
    raise typer.Exit(0 if report.passed else 1)
