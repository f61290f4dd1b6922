"""Kubernetes manifests for the same deployment `launch` would start: one server, a multi-node server, or PD.

Containers run the very commands launch builds (same mapping, same checks), with `python3` and host 0.0.0.0.
Multi-node servers are a StatefulSet whose pod index is the node rank; PD is three Deployments (prefill,
decode, router) with a Service each, the router pointing at the workers' Services. The model directory is
expected on a PersistentVolumeClaim named `hybridctl-models`, mounted read-only at the model path's parent.

The objects are plain dicts written by PyYAML's safe dumper; string values are double-quoted, so "on", "0.10"
or "1e3" never change type. tests/control/test_k8s_schema.py validates every shape against the Kubernetes schema.
"""

from __future__ import annotations

import posixpath
from typing import Any

import yaml

from hybridctl.config.schema import HybridConfig
from hybridctl.launch.pd import pd_plan
from hybridctl.launch.sglang import sglang_argv, sglang_translation

DEFAULT_IMAGE = "lmsysorg/sglang:v{version}"
NAME = "hybridctl"


def _labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": component}


def _gpus_per_pod(cfg: HybridConfig) -> int:
    server = cfg.config.server
    return max(1, server.tp_size * server.dp_size // server.nnodes)


def _volumes(cfg: HybridConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # SGLang's workers share tensors through /dev/shm; the container default (64 MiB) is far too small.
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    model = cfg.config.server.model_path
    if model.startswith("/"):
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": f"{NAME}-models"}})
        mounts.append({"name": "models", "mountPath": posixpath.dirname(model.rstrip("/")) or "/",
                       "readOnly": True})  # fmt: skip
    return volumes, mounts


def _container(cfg: HybridConfig, component: str, argv: list[str], port: int, image: str, gpus: int) -> dict[str, Any]:
    _, mounts = _volumes(cfg)
    container: dict[str, Any] = {
        "name": component,
        "image": image,
        "command": argv,
        "ports": [{"containerPort": port, "name": "http"}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": port},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },  # fmt: skip
        "startupProbe": {
            "httpGet": {"path": "/health", "port": port},
            "periodSeconds": 10,
            "failureThreshold": 180,
        },  # fmt: skip
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        container["volumeMounts"] = mounts
    return container


def _service(component: str, port: int, headless: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": _labels(component), "ports": [{"name": "http", "port": port,
                                                                      "targetPort": port}]}  # fmt: skip
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{NAME}-{component}",
            "labels": _labels(component)}, "spec": spec}  # fmt: skip


def _deployment(cfg: HybridConfig, component: str, container: dict[str, Any], gpus: int) -> dict[str, Any]:
    volumes, _ = _volumes(cfg)
    pod: dict[str, Any] = {"containers": [container]}
    if gpus:
        pod["volumes"] = volumes
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"{NAME}-{component}", "labels": _labels(component)},
        "spec": {"replicas": 1, "selector": {"matchLabels": _labels(component)},
                 "template": {"metadata": {"labels": _labels(component)}, "spec": pod}},
    }  # fmt: skip


def _in_pod(cfg: HybridConfig) -> HybridConfig:
    pod_cfg = cfg.model_copy(deep=True)
    pod_cfg.config.server.host = "0.0.0.0"  # reachable through the Service, not only from inside the pod
    return pod_cfg


def _multinode(cfg: HybridConfig, version: str, image: str, allow_ignored: bool) -> list[dict[str, Any]]:
    server = cfg.config.server
    component = "server"
    headless = f"{NAME}-{component}-nodes"
    flags = dict(sglang_translation(cfg, version, allow_ignored).flags)
    # Node 0's stable DNS name through the headless Service; the rank is the StatefulSet pod index.
    port = (server.dist_init_addr or ":5000").rsplit(":", 1)[-1] or "5000"
    flags["--dist-init-addr"] = f"{NAME}-{component}-0.{headless}:{port}"
    flags["--node-rank"] = "$(NODE_RANK)"
    argv = sglang_argv(flags, "python3")
    container = _container(cfg, component, argv, server.port, image, _gpus_per_pod(cfg))
    container["env"] = [{"name": "NODE_RANK", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}}]  # fmt: skip
    volumes, _ = _volumes(cfg)
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": f"{NAME}-{component}", "labels": _labels(component)},
        "spec": {"replicas": server.nnodes, "serviceName": headless, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": _labels(component)},
                 "template": {"metadata": {"labels": _labels(component)},
                              "spec": {"containers": [container], "volumes": volumes}}},
    }  # fmt: skip
    nodes = _service(component, server.port, headless=True)
    nodes["metadata"]["name"] = headless
    return [statefulset, nodes, _service(component, server.port)]


def k8s_manifests(cfg: HybridConfig, version: str, image: str | None = None, allow_ignored: bool = False) -> str:
    """Multi-document YAML (Deployments/StatefulSet + Services) serving `cfg` with SGLang `version`."""
    image = image or DEFAULT_IMAGE.format(version=version)
    pod_cfg = _in_pod(cfg)
    gpus = _gpus_per_pod(cfg)
    docs: list[dict[str, Any]] = []
    if cfg.config.pd.enable_pd_disaggregation:
        plan = pd_plan(pod_cfg, version, python="python3", allow_ignored=allow_ignored)
        for command in (plan.prefill, plan.decode):
            argv = [a for a in command.argv]
            if "--base-gpu-id" in argv:  # one GPU set per pod: no offset inside the pod
                i = argv.index("--base-gpu-id")
                del argv[i : i + 2]
            docs += [_deployment(pod_cfg, command.role, _container(pod_cfg, command.role, argv, command.port,
                                                                    image, gpus), gpus),
                     _service(command.role, command.port)]  # fmt: skip
        router = list(plan.router.argv)
        pd = cfg.config.pd
        router[router.index("--prefill") + 1] = f"http://{NAME}-prefill:{pd.prefill_port}"
        router[router.index("--decode") + 1] = f"http://{NAME}-decode:{pd.decode_port}"
        router_container = _container(pod_cfg, "router", router, plan.router.port, image, 0)
        docs += [_deployment(pod_cfg, "router", router_container, 0), _service("router", plan.router.port)]
    elif cfg.config.server.nnodes > 1:
        docs += _multinode(pod_cfg, version, image, allow_ignored)
    else:
        argv = sglang_argv(sglang_translation(pod_cfg, version, allow_ignored).flags, "python3")
        port = pod_cfg.config.server.port
        docs += [_deployment(pod_cfg, "server", _container(pod_cfg, "server", argv, port, image, gpus), gpus),
                 _service("server", port)]  # fmt: skip
    header = f"# Kubernetes manifests written by hybridctl for SGLang {version}\n"
    return header + dump_documents(docs)


class _ManifestDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing string values double-quoted and lists indented under their key."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # Block lists indented under their key (as in the Kubernetes docs), not flush with it.
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        # The same dict placed twice (labels) is written out twice: anchors and aliases are valid YAML but hard
        # to read and to edit in a manifest.
        return True


def _quoted_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Double-quoted, always: PyYAML decides what needs quotes by YAML 1.1 and Kubernetes parses by its own rules,
    # so "1e3", which PyYAML would write plain, reaches a cluster as a number (and `command` takes strings only).
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')


def _plain_keys(dumper: yaml.SafeDumper, value: dict[Any, Any]) -> yaml.MappingNode:
    node = dumper.represent_dict(value)
    for key, _ in node.value:
        # Keys read best plain; the emitter still quotes one that plain would change (a key "on" stays a string).
        key.style = None
    return node


_ManifestDumper.add_representer(str, _quoted_str)
_ManifestDumper.add_representer(dict, _plain_keys)


def dump_documents(documents: list[dict[str, Any]]) -> str:
    """Multi-document YAML, one document per manifest object, keys in the order the objects list them."""
    # width: a long argument stays on one line rather than folded with escaped line breaks.
    return yaml.dump_all(documents, Dumper=_ManifestDumper, sort_keys=False, width=1 << 16)
