"""PD on the bundled runtime: one config -> prefill + decode runtimes and hybridctl's router (no torch)."""

from __future__ import annotations

import pytest

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.pd_router import Workers, parse_args, pd_bodies, single_prompt
from hybridctl.launch.plan import make_launch_plan
from hybridctl.launch.translate import LaunchError
from hybridshared.flags.runtime_parser import parse_args as runtime_parse_args


def _cfg(**pd: object) -> HybridConfig:
    cfg = HybridConfig()
    cfg.config.server.model_path = "/models/tiny"
    cfg.config.server.engine = "builtin"
    cfg.config.server.port = 31000
    cfg.config.pd.enable_pd_disaggregation = True
    for key, value in pd.items():
        setattr(cfg.config.pd, key, value)
    return cfg


def test_pd_plan_starts_prefill_decode_then_the_router_on_the_public_port() -> None:
    plan = make_launch_plan(_cfg(prefill_port=31100, decode_port=31200, bootstrap_port=31300))
    assert [c.role for c in plan.commands] == ["prefill", "decode", "router"]
    assert plan.url == "http://127.0.0.1:31000"
    prefill = runtime_parse_args(plan.commands[0].argv[3:])
    decode = runtime_parse_args(plan.commands[1].argv[3:])
    assert (prefill.disaggregation_mode, prefill.port, prefill.disaggregation_bootstrap_port) == (
        "prefill", 31100, 31300)  # fmt: skip
    assert (decode.disaggregation_mode, decode.port) == ("decode", 31200)
    router = plan.commands[2].argv
    assert router[1:3] == ["-m", "hybridctl.launch.pd_router"]
    workers, host, port = parse_args(router[3:])
    assert workers == Workers("http://127.0.0.1:31100", 31300, "http://127.0.0.1:31200")
    assert (host, port) == ("127.0.0.1", 31000)


def test_pd_plan_refuses_shared_ports() -> None:
    with pytest.raises(LaunchError, match=r"four different ports.*\[pd\] decode_port = 31000"):
        make_launch_plan(_cfg(decode_port=31000))


def test_router_routes_single_prompts_with_one_room_and_rid_to_both_servers() -> None:
    workers = Workers("http://127.0.0.1:1", 2, "http://127.0.0.1:3")
    prefill, decode = pd_bodies(workers, "/generate", {"text": "hi", "stream": True})
    assert prefill["bootstrap_room"] == decode["bootstrap_room"] and prefill["rid"] == decode["rid"]
    assert (decode["bootstrap_host"], decode["bootstrap_port"], decode["stream"]) == ("127.0.0.1", 2, True)
    assert prefill["stream"] is False
    other, _ = pd_bodies(workers, "/generate", {"text": "hi"})
    assert other["bootstrap_room"] != prefill["bootstrap_room"]
    assert single_prompt("/generate", {"input_ids": [1, 2]})
    assert not single_prompt("/generate", {"text": ["a", "b"]})
    assert single_prompt("/v1/completions", {"prompt": "x"})
    assert not single_prompt("/v1/completions", {"prompt": ["x", "y"]})
    assert single_prompt("/v1/chat/completions", {"messages": []})
