"""Put a started engine client in its PD role (`--disaggregation-mode prefill|decode`)."""

from __future__ import annotations

import logging

from hybridshared.flags.runtime_args import RuntimeArgs
from runtime.core.config import read_hf_config
from runtime.engine.api import EngineClient
from runtime.engine.engine_thread import ThreadedEngineClient
from runtime.pd.protocol import pool_layout

logger = logging.getLogger("runtime.pd")


class PDSetupError(RuntimeError):
    """The PD role cannot start (the message names the flag to change)."""


def wrap_client(client: ThreadedEngineClient, args: RuntimeArgs) -> EngineClient:
    core = client.core
    model_type = str(read_hf_config(args.model_path).get("model_type"))
    layout = pool_layout(core.pools.buffers, model_type, args.tp_size)
    if core.spec is not None:
        raise PDSetupError(
            f"--disaggregation-mode {args.disaggregation_mode} with --speculative-algorithm: the bundled "
            "runtime's PD transfer carries no draft state; turn speculative decoding off on PD servers."
        )
    if args.disaggregation_mode == "prefill":
        from runtime.pd.prefill import PrefillClient

        try:
            wrapped: EngineClient = PrefillClient(client, args.host, args.disaggregation_bootstrap_port, layout)
        except OSError as exc:
            raise PDSetupError(
                f"--disaggregation-bootstrap-port {args.disaggregation_bootstrap_port}: cannot listen on "
                f"{args.host} ({exc.strerror or exc}); pick a free port ([pd] bootstrap_port in config.toml)."
            ) from None
    else:
        from runtime.pd.decode import DecodeClient

        wrapped = DecodeClient(client, layout)
    logger.info(
        "PD disaggregation: mode=%s, transfer=atomic (all layers' KV + recurrent state, one transfer), "
        "state_bytes_per_request=%d, kv_bytes_per_token=%d",
        args.disaggregation_mode,
        layout["state_bytes_per_request"],
        layout["kv_bytes_per_token"],
    )
    return wrapped
