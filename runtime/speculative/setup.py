"""Build the speculative decoder for an engine: resolve the options, carve the sandbox out of the state pool
buffers, wrap the model's recurrent mixers, load the drafter."""

from __future__ import annotations

import logging

import torch
from torch import nn

from runtime.core.batch import PoolBuffers
from runtime.core.config import EngineArgs
from runtime.core.speculative_config import SpecConfig, SpecConfigError, resolve_spec_config
from runtime.kvcache.cache_manager import CacheManager
from runtime.models.layers.state_checkpoints import supports_state_checkpoints
from runtime.speculative.drafter import Drafter
from runtime.speculative.sandbox import StateSandbox, install_sandbox
from runtime.speculative.worker import SpecDecoder

logger = logging.getLogger("runtime.speculative")


def spec_config_from_args(args: EngineArgs) -> SpecConfig | None:
    """Raises SpecConfigError (the engine turns it into a start-up refusal)."""
    return resolve_spec_config(
        args.speculative_algorithm,
        args.speculative_num_steps,
        args.speculative_num_draft_tokens,
        args.speculative_eagle_topk,
        args.speculative_draft_model_path,
        sandbox=args.enable_mamba_state_sandbox,
    )


def build_spec_decoder(
    config: SpecConfig,
    args: EngineArgs,
    model: nn.Module,
    buffers: PoolBuffers,
    *,
    sandbox_first_slot: int,
    sandbox_slots: int,
    max_running_requests: int,
    token_capacity: int,
    dtype: torch.dtype,
    cache: CacheManager | None = None,
) -> SpecDecoder:
    """The speculative decoder; `buffers` slots [sandbox_first_slot, + sandbox_slots) are its draft states'
    scratch (engine/pool_setup.py sizes them)."""
    groups = sandbox_slots // config.num_draft_tokens
    in_forward = supports_state_checkpoints(model)
    sandbox = StateSandbox(buffers, sandbox_first_slot, groups, config.num_draft_tokens, in_forward=in_forward)
    wrapped = 0 if in_forward else install_sandbox(model, sandbox)
    recurrent = sum(1 for m in model.modules() if hasattr(m, "conv_state_shape"))
    if not in_forward and wrapped < recurrent:
        # A recurrent layer neither checkpointed nor wrapped would keep a rejected draft's update.
        raise SpecConfigError(
            f"speculative decoding: {recurrent - wrapped} recurrent layers of {type(model).__name__} can neither "
            f"write in-forward state checkpoints nor be stepped by the state sandbox, so rejected drafts could "
            f"not be rolled back; turn speculative decoding off ([speculative] speculative_algorithm in "
            f"config.toml)."
        )
    drafter = _drafter(config, args, model, max_running_requests, token_capacity, dtype, cache)
    logger.info(
        "Speculative decoding: algorithm=%s, num_steps=%d, num_draft_tokens=%d, topk=1, sandbox slots=%d "
        "(%d groups x %d) after slot %d, states written by %s",
        config.algorithm,
        config.num_steps,
        config.num_draft_tokens,
        sandbox.num_slots,
        groups,
        config.num_draft_tokens,
        sandbox_first_slot - 1,
        "in-forward checkpoints" if in_forward else f"per-token stepping ({wrapped} wrapped layers)",
    )
    return SpecDecoder(config, drafter, sandbox)


def _drafter(
    config: SpecConfig,
    args: EngineArgs,
    model: nn.Module,
    max_running_requests: int,
    token_capacity: int,
    dtype: torch.dtype,
    cache: CacheManager | None,
) -> Drafter:
    if config.algorithm == "NGRAM":
        from runtime.speculative.ngram import NgramDrafter

        return NgramDrafter(config.num_drafts)
    if config.algorithm == "STANDALONE":
        from runtime.speculative.standalone import StandaloneDrafter

        assert config.draft_model_path is not None
        drafter = StandaloneDrafter(
            config.draft_model_path,
            config.num_drafts,
            max_running_requests=max_running_requests,
            token_capacity=token_capacity,
            dtype=dtype,
            device=args.device,
        )
        b = drafter.buffers
        pool_bytes = sum(t.numel() * t.element_size() for t in (*b.k, *b.v, *b.conv, *b.ssm))
        logger.info(
            "Draft model loaded (outside the target's pool budget): path=%s, weights %.2f GB, KV tokens %d, "
            "state slots %d, pools %.2f GB",
            config.draft_model_path,
            drafter.weight_bytes / (1 << 30),
            token_capacity,
            drafter.num_slots,
            pool_bytes / (1 << 30),
        )
        return drafter
    from runtime.speculative.mtp import MtpDrafter, mtp_target

    target = mtp_target(model)
    assert cache is not None, "MTP drafting reads the target's KV token slots"
    mtp = MtpDrafter(target, config.num_drafts, cache=cache, max_running_requests=max_running_requests,
                     token_capacity=token_capacity, dtype=dtype, device=args.device)  # fmt: skip
    kv_bytes = sum(t.numel() * t.element_size() for t in (*mtp.buffers.k, *mtp.buffers.v))
    logger.info(
        "MTP drafter (outside the target's pool budget): MTP K/V %.2f MB for %d token slots + %d scratch; "
        "last hidden state per state slot %.2f MB (%d slots)",
        kv_bytes / 1e6,
        token_capacity,
        mtp.buffers.k[0].shape[0] - token_capacity,
        mtp.state_bytes / 1e6,
        mtp.last_hidden.shape[0],
    )
    return mtp
