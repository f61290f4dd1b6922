"""What the runtime refuses before it loads anything: the checks of `python -m runtime`'s options that need no
torch and no model weights (the model directory, speculative decoding, the elastic pool, the radix strategy).

`start_context` runs these first, so a bad combination fails in milliseconds with one line naming the flag and
the config.toml key; hybridctl's tests run the same function on every command `launch --dry-run` prints, which is
how `validate` is held to accept only what the runtime accepts.
"""

from __future__ import annotations

from pathlib import Path

from hybridshared.flags.runtime_args import RuntimeArgs
from hybridshared.sizing.pool_sizing import PoolSizingError, resolve_strategy
from hybridshared.sizing.runtime_pools import DEFAULT_MAMBA_TRACK_INTERVAL
from runtime.core.speculative_config import SpecConfigError, resolve_spec_config


class PreflightError(ValueError):
    """An option (or combination) the runtime refuses; the message names the flag and the key to change."""


def check_model_dir(model_path: str) -> None:
    path = Path(model_path)
    try:
        is_dir = path.is_dir()
        has_config = is_dir and (path / "config.json").is_file()
    except (OSError, ValueError) as exc:  # a name longer than the OS allows, a NUL byte, a directory we may not enter
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PreflightError(f"--model-path {model_path[:200]}: cannot be looked up ({why})") from None
    if not is_dir:
        raise PreflightError(f"--model-path {model_path}: no such directory (the runtime loads local models only)")
    if not has_config:
        raise PreflightError(f"--model-path {model_path}: config.json not found; point it at a model directory")


def preflight(args: RuntimeArgs) -> None:
    """Raise PreflightError for what the engine would refuse at start-up; returns when the options can start."""
    check_model_dir(args.model_path)
    try:
        spec = resolve_spec_config(
            args.speculative_algorithm,
            args.speculative_num_steps,
            args.speculative_num_draft_tokens,
            args.speculative_eagle_topk,
            args.speculative_draft_model_path,
            sandbox=not args.disable_mamba_state_sandbox,
        )
    except SpecConfigError as exc:
        raise PreflightError(str(exc)) from None
    if spec is not None and args.enable_elastic_memory_pool:
        raise PreflightError(
            "enable_elastic_memory_pool with speculative decoding: the draft state sandbox lives outside the "
            "elastic buffer; turn one of them off (--enable-elastic-memory-pool / --speculative-algorithm)."
        )
    if args.engine_process and args.disaggregation_mode != "null":
        raise PreflightError(
            f"--engine-process with --disaggregation-mode {args.disaggregation_mode}: PD's transfers run on the "
            "engine thread of the server's own process; drop --engine-process ([extra_engine_args] in config.toml)."
        )
    page = args.page_size or 1
    interval = args.mamba_track_interval or DEFAULT_MAMBA_TRACK_INTERVAL
    if interval % page:
        raise PreflightError(
            f"mamba_track_interval ({interval}) must be a positive multiple of page_size ({page}); set "
            "--mamba-track-interval accordingly ([cache] mamba_track_interval in config.toml)."
        )
    strategy = args.mamba_radix_cache_strategy
    if strategy == "extra_buffer_lazy":
        raise PreflightError(
            "mamba_radix_cache_strategy extra_buffer_lazy needs the overlap schedule, which the bundled "
            'runtime does not have; use --mamba-radix-cache-strategy extra_buffer (or "auto").'
        )
    try:  # the runtime reads auto as extra_buffer (runtime/engine/pool_setup.py)
        resolve_strategy(
            "extra_buffer" if strategy == "auto" else strategy,
            page_size=page,
            overlap_schedule=False,
            disable_radix_cache=args.disable_radix_cache,
            mamba_track_interval=interval,
        )
    except PoolSizingError as exc:
        raise PreflightError(str(exc)) from None
