"""The eager forward's op cuts keep their values: parameter-derived tensors kept between forwards follow every
change of their parameters, and the folded RoPE tables rotate exactly as the textbook formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.models.layers.mamba2 import Mamba2Mixer
from runtime.models.layers.norm import ZeroCenteredRMSNorm
from runtime.models.layers.rotary import RotaryEmbedding


def _reference_zero_centred(norm: ZeroCenteredRMSNorm, x: torch.Tensor) -> torch.Tensor:
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + norm.eps)
    return (h * (1.0 + norm.weight.float())).type_as(x)


@pytest.mark.parametrize("inference", [False, True])
def test_kept_norm_scale_follows_in_place_writes_replacements_and_casts(inference: bool) -> None:
    norm = ZeroCenteredRMSNorm(32, 1e-6)
    x = torch.randn(3, 32)
    mode = torch.inference_mode() if inference else torch.no_grad()
    with torch.no_grad():
        norm.weight.normal_()
    with mode:
        assert torch.equal(norm(x), _reference_zero_centred(norm, x))
    with torch.no_grad():
        norm.weight.mul_(3.0)  # same storage, new version
    with mode:
        assert torch.equal(norm(x), _reference_zero_centred(norm, x))
    norm.weight.data = torch.randn(32)  # new storage
    with mode:
        assert torch.equal(norm(x), _reference_zero_centred(norm, x))
    norm.to(torch.bfloat16)
    xb = x.to(torch.bfloat16)
    with mode:
        assert torch.equal(norm(xb), _reference_zero_centred(norm, xb))


def test_kept_decay_rate_and_conv_taps_follow_the_parameters() -> None:
    mixer = Mamba2Mixer(16, 2, 8, 4, 1, 4, 8, (0.0, float("inf")), 1e-6, False, True)
    with torch.no_grad():
        mixer.A_log.normal_()
        mixer.conv1d.weight.normal_()
    assert torch.equal(mixer._decay_rate(mixer.A_log), -torch.exp(mixer.A_log.float()))
    assert torch.equal(mixer._taps(mixer.conv1d.weight), mixer.conv1d.weight[:, 0, :])
    with torch.no_grad():
        mixer.A_log.add_(1.0)
        mixer.conv1d.weight.copy_(torch.randn_like(mixer.conv1d.weight))
    assert torch.equal(mixer._decay_rate(mixer.A_log), -torch.exp(mixer.A_log.float()))
    assert torch.equal(mixer._taps(mixer.conv1d.weight), mixer.conv1d.weight[:, 0, :])


@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(64, 16), (64, 64), (32, 32), (128, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_rope_tables_rotate_bit_for_bit_as_rotate_half(
    head_dim: int, rotary_dim: int, dtype: torch.dtype
) -> None:
    rope = RotaryEmbedding(head_dim, rotary_dim, 10000.0)
    positions = torch.randint(0, 30000, (7,))
    x = torch.randn(7, 3, head_dim).to(dtype)
    inv = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    emb = torch.cat([positions.float()[:, None] * inv[None, :]] * 2, dim=-1)
    cos, sin = emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]
    x_rot, half = x[..., :rotary_dim], rotary_dim // 2
    rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    expected = torch.cat((x_rot * cos + rotated * sin, x[..., rotary_dim:]), dim=-1)
    assert torch.equal(RotaryEmbedding.rotate(x, *rope.cos_sin(positions, dtype)), expected)
    assert F.mse_loss(expected.float(), x.float()) > 0  # it does rotate
