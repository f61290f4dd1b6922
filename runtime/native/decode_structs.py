"""The ctypes layouts of hybrid_decode.c's structs (HDMat, HDLayer, HDModel, HDStep), field for field in the C
order: a field out of place here is a wrong pointer in C, so these change only together with the C declarations.
runtime/native/hybrid_decode.py fills them."""

from __future__ import annotations

import ctypes

import torch

FloatPtr = ctypes.POINTER(ctypes.c_float)
IndexPtr = ctypes.POINTER(ctypes.c_int64)
_I64, _D = ctypes.c_int64, ctypes.c_double


class HDMat(ctypes.Structure):
    """A weight matrix (HDMat in dot_gemm.h): its storage and dtype code."""

    _fields_ = [("data", ctypes.c_void_p), ("dtype", _I64)]  # noqa: RUF012 - ctypes' declared layout


# The weight dtypes the kernel reads in place (dot_gemm.h widens bf16 in registers), with their C codes.
WEIGHT_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


class HDLayer(ctypes.Structure):
    _fields_ = [  # noqa: RUF012 - ctypes' declared layout, in hybrid_decode.c's HDLayer order
        ("kind", _I64),
        ("ordinal", _I64),
        ("in_norm", FloatPtr),
        ("post_norm", FloatPtr),
        ("nk", _I64),
        ("nv", _I64),
        ("dk", _I64),
        ("dv", _I64),
        ("kernel", _I64),
        ("w_qkv", HDMat),
        ("w_z", HDMat),
        ("w_b", HDMat),
        ("w_a", HDMat),
        ("conv_w", FloatPtr),
        ("conv_b", FloatPtr),
        ("neg_a", FloatPtr),
        ("dt_bias", FloatPtr),
        ("gnorm_w", FloatPtr),
        ("w_out", HDMat),
        ("nh", _I64),
        ("nkv", _I64),
        ("hd", _I64),
        ("rot_dim", _I64),
        ("out_gate", _I64),
        ("wq", HDMat),
        ("wk", HDMat),
        ("wv", HDMat),
        ("wo", HDMat),
        ("bq", FloatPtr),
        ("bk", FloatPtr),
        ("bv", FloatPtr),
        ("bo", FloatPtr),
        ("q_norm", FloatPtr),
        ("k_norm", FloatPtr),
        ("inv_freq", FloatPtr),
        ("attn_scale", _D),
        ("n_exp", _I64),
        ("top_k", _I64),
        ("exp_inter", _I64),
        ("norm_topk", _I64),
        ("router", HDMat),
        ("exp_gate_up", HDMat),
        ("exp_down", HDMat),
        ("mlp_inter", _I64),
        ("mlp_gate", HDMat),
        ("mlp_up", HDMat),
        ("mlp_down", HDMat),
        ("shared_gate", HDMat),
        ("mh", _I64),
        ("mp", _I64),
        ("mn", _I64),
        ("mg", _I64),
        ("w_in", HDMat),
        ("b_in", FloatPtr),
        ("b_out", FloatPtr),
        ("d_skip", FloatPtr),
        ("dt_min", _D),
        ("dt_max", _D),
        ("route", _I64),
        ("n_group", _I64),
        ("topk_group", _I64),
        ("score_bias", FloatPtr),
        ("routed_scale", _D),
        ("exp_relu2", _I64),
        ("kda_q", HDMat),
        ("kda_k", HDMat),
        ("kda_v", HDMat),
        ("kda_fa", HDMat),
        ("kda_fb", HDMat),
        ("kda_ga", HDMat),
        ("kda_gb", HDMat),
        ("kda_b", HDMat),
        ("mla_nope", _I64),
        ("mla_rope", _I64),
        ("mla_v", _I64),
        ("mla_lora", _I64),
        ("mla_q_lora", _I64),
        ("mla_qa", HDMat),
        ("mla_qb", HDMat),
        ("mla_kva", HDMat),
        ("mla_kvb", HDMat),
        ("mla_kT", HDMat),
        ("mla_qa_b", FloatPtr),
        ("mla_kva_b", FloatPtr),
        ("mla_qa_norm", FloatPtr),
        ("mla_kv_norm", FloatPtr),
        ("mla_eps", _D),
        ("attn_in_mul", _D),
        ("attn_out_mul", _D),
        ("ssm_in_mul", _D),
        ("ssm_out_mul", _D),
        ("key_mul", _D),
        ("mlp_gate_mul", _D),
        ("mlp_down_mul", _D),
        ("in_proj_mul", FloatPtr),
        ("gate_mode", _I64),
    ]


class HDModel(ctypes.Structure):
    _fields_ = [  # noqa: RUF012 - ctypes' declared layout (HDModel)
        ("hidden", _I64),
        ("vocab", _I64),
        ("n_layers", _I64),
        ("eps", _D),
        ("embed_scale", _D),
        ("embed", HDMat),
        ("final_norm", FloatPtr),
        ("lm_head", HDMat),
        ("layers", ctypes.POINTER(HDLayer)),
        ("residual_scale", _D),
        ("logits_div", _D),
        ("logits_mul", _D),
    ]


FloatPtrTable = ctypes.POINTER(FloatPtr)


class HDStep(ctypes.Structure):
    _fields_ = [  # noqa: RUF012 - ctypes' declared layout (HDStep)
        ("batch", _I64),
        ("ids", IndexPtr),
        ("positions", IndexPtr),
        ("out_locs", IndexPtr),
        ("state_slots", IndexPtr),
        ("kv_offsets", IndexPtr),
        ("kv_flat", IndexPtr),
        ("k_pool", FloatPtrTable),
        ("v_pool", FloatPtrTable),
        ("conv_pool", FloatPtrTable),
        ("ssm_pool", FloatPtrTable),
        ("token_slots", _I64),
        ("state_slots_count", _I64),
        ("logits", FloatPtr),
        ("chain", _I64),
        ("fresh", _I64),
        ("last_logits", _I64),
        ("n_checkpoints", _I64),
        ("checkpoint_tokens", IndexPtr),
        ("checkpoint_slots", IndexPtr),
    ]
