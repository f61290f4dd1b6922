"""`hybridctl bench`: load a running server with streamed requests and report latency and throughput.

Exit codes: 0 every request succeeded, 1 some failed, 2 the server cannot be reached or the options are invalid.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, cast

import typer

from hybridctl.cli.app import app
from hybridctl.cli.config_args import API_KEY_ENV_OPT, NO_FILES, URL_OPT, ConfigFiles, json_option, takes_config_files
from hybridctl.cli.output import fail, print_json

if TYPE_CHECKING:
    from rich.console import Console

    from hybridctl.bench.datasets import DatasetName
    from hybridctl.bench.results import BenchResult
    from hybridctl.bench.runner import BenchOptions
    from hybridctl.config.schema import HybridConfig
    from hybridctl.verify.client import Target


@app.command("bench")
@takes_config_files()
def bench(
    url: str | None = URL_OPT,
    files: ConfigFiles = NO_FILES,
    api_key_env: str | None = API_KEY_ENV_OPT,
    dataset: str = typer.Option(
        "generated-shared-prefix", "--dataset", help="generated-shared-prefix (SGLang's shape) or random."
    ),
    num_groups: int = typer.Option(4, "--num-groups", help="Shared-prefix groups (system prompts)."),
    prompts_per_group: int = typer.Option(4, "--prompts-per-group", help="Questions per system prompt."),
    system_prompt_len: int = typer.Option(512, "--system-prompt-len", help="System prompt tokens."),
    question_len: int = typer.Option(64, "--question-len", help="Question tokens."),
    num_prompts: int = typer.Option(16, "--num-prompts", help="Requests of the random dataset."),
    input_len: int = typer.Option(256, "--input-len", help="Prompt tokens of the random dataset."),
    range_ratio: float = typer.Option(1.0, "--range-ratio", help="random: lengths drawn from [len*ratio, len]."),
    output_len: int = typer.Option(32, "--output-len", help="Tokens generated per request."),
    max_concurrency: int = typer.Option(
        8, "--max-concurrency", min=0, help="Requests in flight at most (0: no limit)."
    ),
    request_rate: float = typer.Option(math.inf, "--request-rate", help="Poisson arrivals per second (inf: all)."),
    seed: int = typer.Option(0, "--seed", help="Seed for prompts, order and arrivals."),
    flush: bool = typer.Option(True, "--flush/--no-flush", help="Flush the prefix cache before the run."),
    plot: str | None = typer.Option(None, "--plot", help="Write latency histograms to this PNG (matplotlib)."),
    as_json: bool = json_option("the result"),
) -> None:
    """Benchmark a running server: TTFT, TPOT, ITL, E2E, throughput, cache hit rate, accept length."""
    from rich.console import Console

    from hybridctl.bench.datasets import DatasetError, RandomShape, SharedPrefixShape
    from hybridctl.bench.loadgen import LoadShape
    from hybridctl.bench.runner import BenchOptions, BenchOptionsError
    from hybridctl.config.findings import ConfigError
    from hybridctl.verify.client import ServerError, ServerUnreachable
    from hybridctl.verify.runner import TargetError, load_config, resolve_target

    config_path, settings_path = files.config, files.settings  # None: ./config.toml
    err = Console(stderr=True)
    _check_plot(plot)
    options = BenchOptions(
        dataset=cast("DatasetName", dataset),  # options.validate() refuses an unknown name
        shared_prefix=SharedPrefixShape(num_groups, prompts_per_group, system_prompt_len, question_len, output_len),
        random=RandomShape(num_prompts, input_len, output_len, range_ratio),
        load=LoadShape(max_concurrency=max_concurrency or None, request_rate=request_rate, seed=seed),
        flush=flush,
    )
    try:
        options.validate()
        cfg = load_config(str(config_path) if config_path else None, str(settings_path) if settings_path else None)
        target = resolve_target(url, cfg, api_key_env)
    except (ConfigError, TargetError, BenchOptionsError) as exc:
        raise fail(str(exc)) from None
    try:
        result = _run_with_progress(target, options, cfg, err, show=not as_json)
    except (ServerUnreachable, ServerError, DatasetError) as exc:
        raise fail(str(exc)) from None
    _show(result, plot, as_json)
    raise typer.Exit(0 if result.failed == 0 else 1)


def _check_plot(plot: str | None) -> None:
    import importlib.util

    if plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise fail("--plot needs matplotlib, which is not installed: `pip install matplotlib`, or drop --plot")


def _show(result: BenchResult, plot: str | None, as_json: bool) -> None:
    """The histograms to --plot's file, then the result as a table or JSON."""
    from rich.console import Console

    if plot is not None and result.run is not None:
        from hybridctl.bench.plot import plot_latencies

        plot_latencies(result.run, plot)
        result.notes.append(f"latency histograms written to {plot}")
    if as_json:
        print_json(result.to_dict())
    else:
        from hybridctl.bench.render import render_bench

        render_bench(result, Console())


def _run_with_progress(
    target: Target, options: BenchOptions, cfg: HybridConfig | None, err: Console, show: bool
) -> BenchResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hybridctl.bench.runner import run_bench

    with Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                  disable=not show, transient=True) as progress:  # fmt: skip
        task = progress.add_task("requests", total=None)
        return run_bench(
            target, options, cfg,
            on_start=lambda n: progress.update(task, total=n),
            on_done=lambda _record: progress.advance(task),
        )  # fmt: skip
