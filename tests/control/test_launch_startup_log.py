"""The start-up log parser on lines in SGLang 0.5.23's exact formats (its f-strings, filled in)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hybridctl.logs.startup import parse_startup_text

SGLANG_LOG = """\
[2026-11-29 10:00:01] server_args=ServerArgs(model_path='/models/qwen3-next', ...)
[2026-11-29 10:00:41 TP0] Load weight end. elapsed=38.12 s, type=Qwen3NextForCausalLM, avail mem=58.21 GB
[2026-11-29 10:00:42 TP0] Mamba Cache is allocated. max_mamba_cache_size: 216, conv_state size: 0.71GB, \
ssm_state size: 15.19GB
[2026-11-29 10:00:42 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1481216, K size: 8.48 GB, \
V size: 8.48 GB
[2026-11-29 10:00:43 TP0] Tree cache initialized: source=default impl=UnifiedRadixCache hybrid_swa=False \
hybrid_ssm=True hicache_attached=False
[2026-11-29 10:00:50 TP0] max_total_num_tokens=1481216, chunked_prefill_size=8192, max_prefill_tokens=16384, \
max_running_requests=72, context_len=262144, available_gpu_mem=10.52 GB
[2026-11-29 10:00:58] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-11-29 10:01:02] The server is fired up and ready to roll!
"""


def test_parses_every_pool_line_of_an_sglang_start_up() -> None:
    info = parse_startup_text(SGLANG_LOG)
    assert info.mamba is not None
    assert (info.mamba.max_mamba_cache_size, info.mamba.conv_state_gb, info.mamba.ssm_state_gb) == (
        216,
        0.71,
        15.19,
    )
    assert info.mamba.intermediate_ssm_state_gb is None
    assert len(info.kv) == 1 and info.kv[0].tokens == 1481216 and info.kv[0].dtype == "torch.bfloat16"
    assert abs(info.kv[0].size_gb - 16.96) < 1e-9
    assert (info.max_total_num_tokens, info.chunked_prefill_size, info.max_prefill_tokens) == (
        1481216,
        8192,
        16384,
    )
    assert (info.max_running_requests, info.context_len, info.available_mem_gb) == (72, 262144, 10.52)
    assert info.tree_cache_impl == "UnifiedRadixCache" and info.hybrid_ssm is True
    assert info.ready
    assert len(info.pool_lines) == 4 and info.pool_lines[0].startswith("Mamba Cache is allocated.")


def test_speculative_scratch_and_single_kv_size_variants() -> None:
    text = (
        "Mamba Cache is allocated. max_mamba_cache_size: 40, conv_state size: 0.10GB, ssm_state size: 2.50GB "
        "intermediate_ssm_state_cache size: 1.25GB intermediate_conv_window_cache size: 0.05GB \n"
        "SWA KV Cache is allocated. dtype: torch.float16, #tokens: 2048, KV size: 0.50 GB\n"
        "max_total_num_tokens=2048, chunked_prefill_size=-1, max_prefill_tokens=4096, "
        "max_running_requests=None, context_len=4096, available_cpu_mem=3.00 GB\n"
    )
    info = parse_startup_text(text)
    assert info.mamba is not None and info.mamba.intermediate_ssm_state_gb == 1.25
    assert info.kv[0].label == "SWA" and info.kv[0].size_gb == 0.5
    assert info.chunked_prefill_size == -1 and info.max_running_requests is None
    assert info.available_mem_gb == 3.0 and not info.ready


def test_a_log_without_start_up_lines_yields_nothing() -> None:
    info = parse_startup_text("Traceback (most recent call last):\nRuntimeError: Not enough memory\n")
    assert info.mamba is None and info.kv == [] and info.max_total_num_tokens is None and not info.ready


@pytest.mark.sglang
def test_the_parsed_formats_are_sglangs_own_f_strings() -> None:
    """Guard against drift: the fragments the parser relies on are verbatim in the installed sglang source."""
    venv = Path(os.environ.get("HYBRIDCTL_SGLANG_VENV", Path(__file__).resolve().parents[2] / ".venv-sglang"))
    srt = next(iter(venv.glob("lib/python*/site-packages/sglang/srt")), None)
    if srt is None:
        pytest.skip(f"no sglang in {venv} (.ci/run creates it; or set HYBRIDCTL_SGLANG_VENV)")
    sources = {
        "mem_cache/memory_pool.py": [
            'f"Mamba Cache is allocated. "',
            'f"max_mamba_cache_size: {size}, "',
            'f"conv_state size: {get_tensor_size_bytes(conv_state) / GB:.2f}GB, "',
            'f"ssm_state size: {get_tensor_size_bytes(temporal_state) / GB:.2f}GB "',
            "'is allocated'}. dtype: {self.dtype}, \"",
            'f"#tokens: {num_tokens}, K size: {k_size_GB:.2f} GB, "',
            'f"#tokens: {num_tokens}, KV size: {kv_size_GB:.2f} GB"',
        ],
        "managers/scheduler.py": [
            'f"max_total_num_tokens={self.max_total_num_tokens}, "',
            'f"chunked_prefill_size=',
            'f"max_prefill_tokens={self.max_prefill_tokens}, "',
            'f"max_running_requests={self.max_running_requests}, "',
            'f"context_len={self.model_config.context_len}, "',
        ],
        "mem_cache/registry.py": ['"Tree cache initialized: source=%s impl=%s hybrid_swa=%s hybrid_ssm=%s "'],
        "entrypoints/http_server.py": ['"The server is fired up and ready to roll!"'],
    }
    for name, fragments in sources.items():
        text = (srt / name).read_text()
        for fragment in fragments:
            assert fragment in text, f"{name} no longer contains {fragment}"
