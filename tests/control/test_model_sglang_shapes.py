"""Our per-request state bytes and layer layout against SGLang 0.5.23's own code, run from its source.

SGLang's config modules import torch, transformers and CUDA-only helpers, so they cannot be imported here.
Instead the pure parts are lifted out of the real source files with `ast` (imports dropped) and executed
against tiny stand-ins for torch dtypes and the parallel context: `Mamba2StateShape.create`,
`KimiLinearStateShape.create`, `mamba_cache_per_req`, `mamba2_state_dtype`, and each family config class's
layer-id and `mamba2_cache_params` properties. Skipped only when the SGLang source tree is absent.
"""

from __future__ import annotations

import ast
import json
import logging
import sys
import types
import typing
from abc import ABC
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy
import pytest
from sglang_source import SKIP_REASON, SRT, TEMPLATES, exec_lifted, lift

from hybridctl.model.bundled import load_model_shape_or_bundled
from hybridshared.model.errors import ModelShapeError

pytestmark = pytest.mark.skipif(not (SRT / "configs" / "mamba_utils.py").is_file(), reason=SKIP_REASON)


class _DType:
    """Stands in for torch.dtype: SGLang's byte math only reads `.itemsize`."""

    def __init__(self, name: str, itemsize: int) -> None:
        self.name, self.itemsize = name, itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"


_TORCH = types.SimpleNamespace(
    dtype=_DType, float32=_DType("float32", 4), bfloat16=_DType("bfloat16", 2), float16=_DType("float16", 2)
)


class _Env:
    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


def _module(name: str) -> dict[str, Any]:
    # dataclasses resolves a class's module through sys.modules; give the lifted code a real module.
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    return mod.__dict__


_SSM_ENV = _Env(None)


@pytest.fixture(scope="module")
def mamba_utils() -> dict[str, Any]:
    utils = SRT / "distributed" / "utils.py"
    ns = _module("_sglang_ref_mamba_utils")
    exec_lifted(lift(utils, {"ensure_divisibility", "divide"}), utils, ns)
    envs = types.SimpleNamespace(SGLANG_MAMBA_CONV_DTYPE=_Env("bfloat16"), SGLANG_MAMBA_SSM_DTYPE=_SSM_ENV)
    ns.update(
        torch=_TORCH,
        np=numpy,
        envs=envs,
        dataclass=dataclass,
        field=field,
        List=list,  # SGLang annotates with typing.List; the builtin subscripts the same
        Optional=typing.Optional,
        ABC=ABC,
        logging=logging,
        logger=logging.getLogger("sglang-ref"),
    )
    path = SRT / "configs" / "mamba_utils.py"
    return exec_lifted(lift(path), path, ns)


def _config_class(path: Path, class_name: str, members: set[str], ns: dict[str, Any]) -> type:
    """The named SGLang config class with only `members` (properties keep their decorators), no base class."""
    tree = ast.parse(path.read_text(), filename=str(path))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    body = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in members]
    stripped = ast.ClassDef(name=class_name, bases=[], keywords=[], body=body, decorator_list=[], type_params=[])
    exec_lifted(lift(path, {"MAMBA", "ATTENTION", "MLP", "MOE", "HybridLayerType"}), path, ns)
    return exec_lifted([stripped], path, ns)[class_name]


def _sglang_params(mu: dict[str, Any], cfg: dict[str, Any], family: str, tp: int) -> Any:
    """What SGLang's config class for `family` returns from `mamba2_cache_params`, plus its layer ids."""
    import enum

    parallel = types.SimpleNamespace(attn_tp_size=tp)
    ns = _module(f"_sglang_ref_{family}")
    ns.update(
        mu,
        enum=enum,
        get_parallel=lambda: parallel,
        linear_attn_tp_size=lambda: tp,
        _is_cpu=False,
        adjust_tp_num_heads_if_necessary=None,
    )
    conf = SRT / "configs"
    attrs = dict(cfg)
    if family in ("qwen3_next", "qwen3_5"):
        attrs = dict(cfg.get("text_config", cfg))
        members = {"layers_block_type", "linear_layer_ids", "full_attention_layer_ids", "mamba2_cache_params"}
        cls = _config_class(conf / "qwen3_next.py", "Qwen3NextConfig", members, ns)
    elif family == "nemotron_h":
        members = {
            "mamba_layer_ids",
            "full_attention_layer_ids",
            "mamba2_cache_params",
            "hybrid_override_pattern",
            "num_hidden_layers",
            "_list_to_pattern",
            "_pattern_to_list",
        }
        cls = _config_class(conf / "nemotron_h.py", "NemotronHConfig", members, ns)
        # nemotron_h.py:307-309 + 363: the pattern becomes layers_block_type; conv_kernel from the checkpoint.
        attrs["layers_block_type"] = cls._pattern_to_list(cfg["hybrid_override_pattern"])
        attrs.pop("num_hidden_layers", None)
    elif family == "falcon_h1":
        members = {"layers_block_type", "full_attention_layer_ids", "linear_layer_ids", "mamba2_cache_params"}
        cls = _config_class(conf / "falcon_h1.py", "FalconH1Config", members, ns)
        # falcon_h1.py:211-221 (__init__): the Mamba width and "auto" head dim.
        inter = cfg.get("mamba_d_ssm") or cfg["mamba_expand"] * cfg["hidden_size"]
        attrs["mamba_intermediate"] = inter
        if cfg.get("mamba_d_head", "auto") == "auto":
            attrs["mamba_d_head"] = inter // cfg["mamba_n_heads"]
    elif family == "granitemoehybrid":
        members = {
            "mamba_layer_ids",
            "attention_layer_ids",
            "full_attention_layer_ids",
            "mamba2_cache_params",
        }
        cls = _config_class(conf / "granitemoehybrid.py", "GraniteMoeHybridConfig", members, ns)
        attrs["mamba_intermediate_size"] = cfg["mamba_expand"] * cfg["hidden_size"]  # granitemoehybrid.py:239
    else:
        members = {"is_kda_layer", "linear_layer_ids", "full_attention_layer_ids", "mamba2_cache_params"}
        cls = _config_class(conf / "kimi_linear.py", "KimiLinearConfig", members, ns)
    obj = cls.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


CASES = [
    (name, tp, ssm)
    for name in sorted(p.name for p in TEMPLATES.glob("*.json"))
    for tp in (1, 2, 3, 4, 8, 16)
    for ssm in (None, "bfloat16")
]


@pytest.mark.parametrize(("name", "tp", "ssm"), CASES)
def test_state_bytes_and_layers_match_sglang(mamba_utils: dict[str, Any], name: str, tp: int, ssm: str | None) -> None:
    path = TEMPLATES / name
    cfg = json.loads(path.read_text())
    try:
        ours = load_model_shape_or_bundled(path, tp=tp, ssm_dtype=ssm)
    except ModelShapeError:
        ours = None
    family = load_model_shape_or_bundled(path).family
    obj = _sglang_params(mamba_utils, cfg, family, tp)
    _SSM_ENV.value = ssm  # --mamba-ssm-dtype sets SGLANG_MAMBA_SSM_DTYPE (arg_groups/serving_hook.py:439)
    try:
        params = obj.mamba2_cache_params
    except AssertionError:
        assert ours is None, f"SGLang cannot shard {name} {tp} ways but we planned it"
        return
    finally:
        _SSM_ENV.value = None
    assert ours is not None, f"SGLang shards {name} {tp} ways but we refused"
    assert ours.mamba_state_bytes_per_request == params.mamba_cache_per_req
    assert ours.conv_state_shape == tuple(params.shape.conv[0])
    assert ours.ssm_state_shape == tuple(params.shape.temporal)
    assert ours.linear_layer_ids == tuple(params.layers)
    assert ours.attn_layer_ids == tuple(obj.full_attention_layer_ids)


def test_qwen3_next_done_when_numbers(mamba_utils: dict[str, Any]) -> None:
    """The issue's figures: 73.7 MiB per request at TP1, 18.4 MiB at TP4 (fp32 SSM state)."""
    path = TEMPLATES / "qwen3-next-80b-a3b.json"
    cfg = json.loads(path.read_text())
    for tp, mib in ((1, 73.7), (4, 18.4)):
        sglang = _sglang_params(mamba_utils, cfg, "qwen3_next", tp).mamba2_cache_params.mamba_cache_per_req
        ours = load_model_shape_or_bundled(path, tp=tp, ssm_dtype="float32").mamba_state_bytes_per_request
        assert ours == sglang
        assert round(ours / 2**20, 1) == mib


class _NoImports(ast.NodeTransformer):
    """Drops imports inside lifted functions; the names they bind are supplied by the test's namespace."""

    def visit_Import(self, node: ast.Import) -> ast.Pass:  # noqa: N802  (ast visitor naming)
        return ast.copy_location(ast.Pass(), node)

    visit_ImportFrom = visit_Import  # noqa: N815


def _methods(path: Path, class_name: str, names: set[str]) -> list[ast.stmt]:
    tree = ast.parse(path.read_text(), filename=str(path))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return [_NoImports().visit(n) for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names]


@pytest.fixture(scope="module")
def cell_size() -> Any:
    """SGLang's `DefaultPoolConfigurator._compute_cell_size` with `ModelConfig.get_num_kv_heads` behind it."""
    ns = _module("_sglang_ref_cell_size")
    pools = SRT / "model_executor" / "pool_configurator.py"
    model_config = SRT / "configs" / "model_config.py"
    kvc_file = SRT / "mem_cache" / "kv_cache_configurator.py"
    exec_lifted(_methods(pools, "DefaultPoolConfigurator", {"_compute_cell_size"}), pools, ns)
    exec_lifted(
        _methods(model_config, "ModelConfig", {"get_num_kv_heads", "get_total_num_kv_heads"}),
        model_config,
        ns,
    )
    exec_lifted(
        [_NoImports().visit(n) for n in lift(kvc_file, {"calculate_mla_kv_cache_dim"})],
        kvc_file,
        ns,
    )
    return ns


def _sglang_cell(ns: dict[str, Any], cfg: dict[str, Any], family: str, tp: int, num_layers: int) -> int:
    text = dict(cfg.get("text_config", cfg))
    parallel = types.SimpleNamespace(attn_tp_size=tp, attn_dcp_size=1)
    mla = family == "kimi_linear"
    mc = types.SimpleNamespace(
        hf_config=types.SimpleNamespace(model_type=cfg.get("model_type")),
        hf_text_config=types.SimpleNamespace(**text),
        is_draft_model=False,
        attention_arch=None,
        kv_lora_rank=text.get("kv_lora_rank"),
        qk_rope_head_dim=text.get("qk_rope_head_dim"),
        # model_config.py:1341-1354: head_dim falls back to hidden // heads, v_head_dim to head_dim.
        head_dim=text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"],
    )
    mc.v_head_dim = text.get("v_head_dim") or mc.head_dim
    mc.get_total_num_kv_heads = lambda: ns["get_total_num_kv_heads"](mc)
    mc.get_num_kv_heads = lambda t, d=1: ns["get_num_kv_heads"](mc, t, d)
    torch = types.SimpleNamespace(_utils=types.SimpleNamespace(_element_size=lambda dt: dt.itemsize))
    ns.update(
        torch=torch,
        get_parallel=lambda: parallel,
        envs=types.SimpleNamespace(SGLANG_NPU_ENABLE_SPARSE_KV_OFFLOAD=_Env(False)),
        get_glm_dsa_layer_split_effective_num_layers=lambda _kvc, n: n,
        is_deepseek_dsa=lambda _cfg: False,
        is_minimax_sparse=lambda _cfg: False,
        is_float4_e2m1fn_x2=lambda _dt: False,
        get_disagg=lambda: types.SimpleNamespace(disaggregation_mode="null"),
        get_exec=lambda: types.SimpleNamespace(kernel=types.SimpleNamespace()),
        _is_hip=False,
    )
    kvc = types.SimpleNamespace(
        model_config=mc,
        kv_cache_dtype=_TORCH.bfloat16,
        kv_cache_dtype_str="auto",
        server_args=types.SimpleNamespace(enable_hisparse=False),
        use_mla_backend=mla,
    )
    configurator = types.SimpleNamespace(_compute_qsa_cell_size=lambda **_kw: 0, kv_cache_dtype_str="auto")
    return ns["_compute_cell_size"](configurator, kvc, num_layers)


@pytest.mark.parametrize(
    ("name", "tp"), [(n, tp) for n in sorted(p.name for p in TEMPLATES.glob("*.json")) for tp in (1, 2, 4, 8)]
)
def test_kv_bytes_per_token_match_sglang(cell_size: dict[str, Any], name: str, tp: int) -> None:
    path = TEMPLATES / name
    ours = load_model_shape_or_bundled(path, tp=tp, kv_dtype="bfloat16")
    theirs = _sglang_cell(cell_size, json.loads(path.read_text()), ours.family, tp, ours.num_attn_layers)
    assert ours.kv_bytes_per_token == theirs
