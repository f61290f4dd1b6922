"""Every traceback signature earns its place: for each, a bare traceback in which it alone carries the evidence.

The message of each traceback below matches no message pattern and no message family, so nothing but the
signature (exception type + the frames it passed through) can name the failure. Each test checks both ways: the
signature finds its code, and with that one signature taken out the same log is only an UNKNOWN_FAILURE.
"""

from __future__ import annotations

import pytest

from hybridctl.doctor import log_signatures
from hybridctl.doctor.log_findings import UNKNOWN_FAILURE
from tests.control.test_doctor_logs_corpus import codes_of, diagnose_lines


def _tb(frames: list[tuple[str, str]], exception: str) -> list[str]:
    lines = ["[2026-12-01 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):"]
    for i, (path, func) in enumerate(frames):
        lines.append(f'  File "/sgl-workspace/sglang/python/{path}", line {100 + i}, in {func}')
    return [*lines, exception]


# signature id -> (its code, a bare traceback only it explains)
CASES: dict[str, tuple[str, list[str]]] = {
    "tb_spec_track_index": ("SPEC_ROLLBACK", _tb(
        [("sglang/srt/speculative/eagle_worker_v2.py", "verify"),
         ("sglang/srt/managers/schedule_batch.py", "set_mamba_track_indices_from_reqs")],
        "TypeError: 'NoneType' object cannot be interpreted as an integer")),
    "tb_pd_state": ("PD_STATE_MISMATCH", _tb(
        [("sglang/srt/disaggregation/nixl/conn.py", "transfer_worker"),
         ("sglang/srt/disaggregation/nixl/conn.py", "_send_mamba_state")],
        "KeyError: 'dst_state_indices'")),
    "tb_elastic_plugin": ("ELASTIC_TIMEOUT", _tb(
        [("sglang/srt/model_executor/model_runner.py", "init_memory_pool"),
         ("kvcached/page_allocator.py", "map_pages")],
        "IndexError: list index out of range")),
    "tb_prefix_radix": ("PREFIX_CACHE_MISS", _tb(
        [("sglang/srt/managers/scheduler.py", "get_new_batch_prefill"),
         ("sglang/srt/mem_cache/mamba_radix_cache.py", "evict_mamba")],
        "AssertionError")),
    "tb_state_alloc": ("MAMBA_POOL_ALLOC", _tb(
        [("sglang/srt/mem_cache/memory_pool.py", "alloc"),
         ("sglang/srt/mem_cache/memory_pool.py", "_alloc_ping_pong_buffer")],
        "TypeError: 'NoneType' object is not subscriptable")),
    "tb_state_pool_oom": ("MAMBA_POOL_ALLOC", _tb(
        [("sglang/srt/model_executor/model_runner.py", "init_memory_pool"),
         ("sglang/srt/mem_cache/memory_pool.py", "_init_mamba_pool")],
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")),
}  # fmt: skip


def test_every_signature_has_a_case() -> None:
    ids = {s.id for s in log_signatures.SIGNATURES} | {log_signatures.STATE_POOL_OOM.id}
    assert ids == set(CASES)


@pytest.mark.parametrize("sig_id", sorted(CASES))
def test_the_signature_alone_names_the_failure(sig_id: str) -> None:
    code, lines = CASES[sig_id]
    (finding,) = diagnose_lines(lines)
    assert finding.code == code
    assert f"signature: {sig_id} ({code})" in finding.basis
    assert any(b.startswith("frames: ") for b in finding.basis)


@pytest.mark.parametrize("sig_id", sorted(CASES))
def test_without_the_signature_the_log_is_unexplained(sig_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    code, lines = CASES[sig_id]
    if sig_id == log_signatures.STATE_POOL_OOM.id:
        monkeypatch.setattr(log_signatures, "state_pool_oom", lambda tb: False)
    else:
        others = tuple(s for s in log_signatures.SIGNATURES if s.id != sig_id)
        monkeypatch.setattr(log_signatures, "SIGNATURES", others)
    assert codes_of(diagnose_lines(lines)) == [UNKNOWN_FAILURE]


def test_a_source_line_naming_the_state_is_not_a_frame() -> None:
    """`assert not metadata.has_mamba_track_mask` under a frame names mamba tracking, but the assert is the
    prefix cache's (Falcon-Mamba has no radix tracking), not the speculative verify's."""
    lines = _tb([("sglang/srt/layers/attention/mamba/mamba1.py", "forward")], "AssertionError")
    lines.insert(-1, "    assert not metadata.has_mamba_track_mask, (")
    assert "SPEC_ROLLBACK" not in codes_of(diagnose_lines(lines))
