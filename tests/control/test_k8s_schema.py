"""`launch --k8s` manifests against the Kubernetes 1.37 schema (kubernetes-validate ships it, no cluster needed):
every document of every shape launch writes (one server, a multi-node StatefulSet, PD's three Deployments) under
several configs, in strict mode, so a misspelt or misplaced field fails as it would on `kubectl apply`."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate  # the [dev] extra: a missing schema package fails here rather than skipping
import pytest
import yaml

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.k8s import k8s_manifests

VERSION = "0.5.23"
K8S = "1.37"
SECRET = "sk-do-not-write-me-0123456789"


def _cfg(config: dict[str, dict[str, Any]]) -> HybridConfig:
    data: dict[str, Any] = {"config": {"server": {"model_path": "/models/qwen3-next"}}}
    for section, values in config.items():
        data["config"].setdefault(section, {}).update(values)
    return HybridConfig.model_validate(data)


SPEC = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_num_draft_tokens": 4,
        "speculative_draft_model_path": "/models/qwen3-next-eagle"}  # fmt: skip
PD = {"enable_pd_disaggregation": True}
SERVER = [("Deployment", "hybridctl-server"), ("Service", "hybridctl-server")]
MULTI = [("StatefulSet", "hybridctl-server"), ("Service", "hybridctl-server-nodes"), ("Service", "hybridctl-server")]
THREE = [(kind, f"hybridctl-{role}") for role in ("prefill", "decode", "router") for kind in ("Deployment", "Service")]

# (config, the objects written): each shape with TP > 1, speculative decoding, an API key and other ports.
CASES: dict[str, tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]] = {
    "server": ({}, SERVER),
    "server-tp4-port8080": ({"server": {"tp_size": 4, "port": 8080}}, SERVER),
    "server-spec": ({"server": {"tp_size": 2}, "speculative": SPEC}, SERVER),
    "server-api-key-env": ({"server": {"api_key_env": "HYBRIDCTL_TEST_KEY"}}, SERVER),
    "server-hub-model": ({"server": {"model_path": "Qwen/Qwen3-Next-80B-A3B-Instruct"}}, SERVER),
    "multinode": ({"server": {"tp_size": 16, "nnodes": 2, "dist_init_addr": "10.0.0.1:5000"}}, MULTI),
    "multinode-spec-port": (
        {"server": {"tp_size": 8, "nnodes": 4, "dist_init_addr": "10.0.0.1:6123", "port": 9000}, "speculative": SPEC},
        MULTI,
    ),
    "pd": ({"pd": PD}, THREE),
    "pd-tp2-spec-ports": (
        {
            "server": {"tp_size": 2, "port": 9000},
            "speculative": SPEC,
            "pd": {**PD, "prefill_port": 9100, "decode_port": 9200, "bootstrap_port": 9300},
        },
        THREE,
    ),
    "pd-api-key-env": ({"server": {"api_key_env": "HYBRIDCTL_TEST_KEY"}, "pd": PD}, THREE),
}


def _documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.mark.parametrize("case", CASES)
def test_every_manifest_is_valid_kubernetes(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config, objects = CASES[case]
    monkeypatch.setenv("HYBRIDCTL_TEST_KEY", SECRET)
    # allow_ignored: SGLang has no key-from-variable flag, so server.api_key_env is one of the keys launch
    # reports as ignored; the manifests are still written, without the key.
    text = k8s_manifests(_cfg(config), VERSION, allow_ignored=True)
    docs = _documents(text)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == objects
    for doc in docs:
        assert kubernetes_validate.validate(doc, K8S, strict=True) == K8S
    # A secret is never written: the variable's value appears nowhere, nor does a key flag.
    assert SECRET not in text and "--api-key" not in text


def test_the_config_reaches_the_manifests() -> None:
    """The validated documents carry the config (the schema alone would accept an empty command)."""
    config, _ = CASES["pd-tp2-spec-ports"]
    docs = _documents(k8s_manifests(_cfg(config), VERSION))
    prefill, prefill_service, decode, _, router, router_service = docs
    container = prefill["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[command.index("--tp-size") + 1] == "2"
    assert command[command.index("--speculative-algorithm") + 1] == "EAGLE"
    assert container["ports"] == [{"containerPort": 9100, "name": "http"}]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert prefill_service["spec"]["ports"] == [{"name": "http", "port": 9100, "targetPort": 9100}]
    assert "--base-gpu-id" not in decode["spec"]["template"]["spec"]["containers"][0]["command"]
    router_command = router["spec"]["template"]["spec"]["containers"][0]["command"]
    assert router_command[router_command.index("--decode") + 1] == "http://hybridctl-decode:9200"
    assert router_service["spec"]["ports"][0]["port"] == 9000
    # Every argument stays a string on the way through YAML (a number in `command` is refused by Kubernetes).
    assert all(isinstance(arg, str) for arg in command + router_command)


def _break_replicas(doc: dict[str, Any]) -> None:
    doc["spec"]["replicas"] = "1"


def _break_command(doc: dict[str, Any]) -> None:
    doc["spec"]["template"]["spec"]["containers"][0]["command"].append(1000.0)


def _break_field_name(doc: dict[str, Any]) -> None:
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"periodSeconds": 10}


def _break_port(doc: dict[str, Any]) -> None:
    doc["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"


@pytest.mark.parametrize(
    ("breaks", "says"),
    [
        (_break_replicas, "is not of type 'integer'"),
        (_break_command, "is not of type 'string'"),
        (_break_field_name, "readinesProbe"),  # strict: an unknown field is an error, not silently dropped
        (_break_port, "is not of type 'integer'"),
    ],
)
def test_a_broken_manifest_is_rejected(breaks: Any, says: str) -> None:
    """The check above can fail: the same Deployment, broken in one place, is refused."""
    [deployment, _service] = _documents(k8s_manifests(_cfg({}), VERSION))
    broken = copy.deepcopy(deployment)
    breaks(broken)
    with pytest.raises(kubernetes_validate.ValidationError, match=says):
        kubernetes_validate.validate(broken, K8S, strict=True)
    assert kubernetes_validate.validate(deployment, K8S, strict=True) == K8S
