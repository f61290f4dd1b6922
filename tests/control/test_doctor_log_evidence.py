"""What a log finding rests on: the model's recurrent state, message families, what follows a warning, and the
evidence list every finding carries (`basis`, also in --json)."""

from __future__ import annotations

import json

import pytest

from hybridctl.doctor.log_families import match_family
from hybridctl.doctor.log_findings import PREFIX_CACHE_IDLE, UNKNOWN_FAILURE
from hybridctl.logs.architecture import ModelEvidence, classify
from tests.control.test_doctor_logs_corpus import codes_of, diagnose, diagnose_lines

PD_TP = "RuntimeError: PD Disaggregation does NOT support PD different TP sizes for non-MLA hybrid models yet."


@pytest.mark.parametrize(
    ("name", "recurrent"),
    [
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", True), ("Qwen3_5MoeForConditionalGeneration", True),
        ("moonshotai/Kimi-Linear-48B-A3B-Instruct", True), ("NemotronHForCausalLM", True),
        ("tiiuae/Falcon-H1-34B-Instruct", True), ("GraniteMoeHybridForCausalLM", True),
        ("openai/gpt-oss-120b", False), ("GptOssForCausalLM", False), ("Qwen/Qwen3-8B", False),
        ("meta-llama/Llama-3.1-8B-Instruct", False), ("DeepseekV3ForCausalLM", False), ("google/gemma-3-27b-it", False),
        ("my-org/private-model", None),
    ],
)  # fmt: skip
def test_model_families_with_and_without_recurrent_state(name: str, recurrent: bool | None) -> None:
    assert classify(name) is recurrent


def test_the_engines_own_pools_outrank_the_model_name() -> None:
    model = ModelEvidence()
    model.read("server_args={'model_path': 'my-org/llama-hybrid-ft'}")
    assert model.recurrent is False  # the name says llama
    model.read("Mamba Cache is allocated. max_mamba_cache_size: 64, conv_state size: 0.1GB")
    assert model.recurrent is True and "Mamba Cache is allocated" in model.why()
    stateless = ModelEvidence()
    stateless.read("Tree cache initialized: source=default impl=RadixCache hybrid_swa=True hybrid_ssm=False")
    assert stateless.recurrent is False


def test_the_same_message_is_a_failure_only_for_a_model_with_recurrent_state() -> None:
    hybrid = ["[2026-01-01 00:00:00] server_args={'model_path': 'Qwen/Qwen3-Next-80B-A3B-Instruct'}", PD_TP]
    swa = ["[2026-01-01 00:00:00] server_args={'model_path': 'openai/gpt-oss-120b'}", PD_TP]
    unnamed = [PD_TP]
    assert codes_of(diagnose_lines(hybrid)) == ["PD_STATE_MISMATCH"]
    assert codes_of(diagnose_lines(unnamed)) == ["PD_STATE_MISMATCH"]  # a hybrid tool's log: benefit of the doubt
    (f,) = diagnose_lines(swa)
    assert f.code == UNKNOWN_FAILURE
    assert "Nearest known failure mode: PD_STATE_MISMATCH" in f.cause and "without recurrent state" in f.cause
    assert "model: openai/gpt-oss-120b (recurrent state: no; model path openai/gpt-oss-120b is a family without " \
           "recurrent state)" in f.basis  # fmt: skip


def test_the_gpt_oss_issue_is_not_a_pd_state_mismatch() -> None:
    """sgl-project/sglang#38552: the message speaks of SWA hybrids, whose sliding window keeps no state."""
    (f,) = diagnose("neg_gptoss_swa_hetero_tp_two_sides")
    assert f.code == UNKNOWN_FAILURE and "sliding-window" in f.cause


def test_a_checkpoint_skipping_warning_is_a_miss_only_if_later_prefills_cache_nothing() -> None:
    (miss,) = diagnose("dev_prefix_chunked_skip_checkpoints")
    assert (miss.code, miss.severity, miss.line) == ("PREFIX_CACHE_MISS", "warning", 1)
    assert "after the warning: 4 prefills, 0 cached tokens" in miss.basis
    assert PREFIX_CACHE_IDLE not in [f.code for f in diagnose("dev_prefix_chunked_skip_checkpoints")]
    assert diagnose("dev_neg_chunked_skip_then_hits") == []


def test_every_log_finding_states_its_evidence_in_json_too() -> None:
    (f,) = diagnose("dev_prefix_dcp_component_page")
    out = json.loads(json.dumps(f.to_dict()))
    basis = out["basis"]
    assert basis[0] == "message: sglang_mamba_page_assert (PREFIX_CACHE_MISS)"
    assert "exception: AssertionError" in basis
    assert any(b.startswith("frames: ") and "unified_cache.components.mamba.__init__" in b for b in basis)
    assert any(b.startswith("model: Qwen/Qwen3.5-122B-A10B (recurrent state: yes") for b in basis)
    assert "release: release not printed; strategy flag spelled --mamba-radix-cache-strategy" in basis


def test_a_message_family_carries_a_reworded_message() -> None:
    """A wording no pattern knows, in a release that does not exist yet: the family still names it."""
    lines = [
        "[2026-12-01 10:00:00 TP0] Prefill transfer failed for request rank=0 req.rid='x' with exception "
        "Hybrid SSM state geometry differs between prefill and decode (heads 16 vs 8)",
    ]
    (f,) = diagnose_lines(lines)
    assert f.code == "PD_STATE_MISMATCH"
    assert f.basis[0].startswith("message family: PD state transfer (setting: ")


def test_a_family_needs_all_three_parts_and_unknown_failure_says_which_was_missing() -> None:
    full = match_family("AssertionError: Helion KDA verify does not support ReplaySSM rings")
    assert full is not None and full.full and full.family.code == "SPEC_ROLLBACK"
    assert match_family("RuntimeError: FlashInfer GDN decode kernel is unavailable.") is None  # a broken install
    lines = [
        "Traceback (most recent call last):",
        '  File "/x/sglang/srt/speculative/eagle_worker_v2.py", line 3, in verify',
        "KeyError: 'mamba_track_seqlens'",
    ]
    (f,) = diagnose_lines(lines)
    assert f.code == UNKNOWN_FAILURE
    assert "Nearest known failure mode: SPEC_ROLLBACK" in f.cause
    assert "not assigned: the message names no constraint" in f.cause
    assert "innermost SGLang frame: sglang.srt.speculative.eagle_worker_v2.verify" in f.cause


def test_an_error_line_outside_a_traceback_is_read_for_its_family() -> None:
    (f,) = diagnose("ho_pd_mori_single_index")
    assert f.code == "PD_STATE_MISMATCH" and f.line == 1 and f.basis[0].startswith("message family: ")


def test_a_crash_in_pool_set_up_under_an_elastic_stack_is_that_stacks_failure() -> None:
    """kvcached patched the pools and logged its start; the traceback itself only shows SGLang's frames."""
    lines = [
        "[2026-06-01 09:00:00] Load weight end. type={arch}, dtype=torch.bfloat16, avail mem=60.00 GB",
        "[kvcached][INFO][2026-06-01 09:00:01][page_allocator.py:152] Init kvcached KV cache allocator: num_layers=12",
        "[2026-06-01 09:00:01] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/venv/lib/python3.12/site-packages/sglang/srt/model_executor/model_runner.py", line 1990, in '
        "init_memory_pool",
        "NotImplementedError: Hybrid models with more than one KV cache type are not supported yet",
    ]
    (f,) = diagnose_lines([line.format(arch="Qwen3NextForCausalLM") for line in lines])
    assert f.code == "ELASTIC_TIMEOUT" and f.basis[0].startswith("plugin stack: kvcached active (line 2)")
    (g,) = diagnose_lines([line.format(arch="GptOssForCausalLM") for line in lines])
    assert g.code == UNKNOWN_FAILURE  # the same crash for a model without recurrent state
    without_stack = [line.format(arch="Qwen3NextForCausalLM") for line in lines if "kvcached" not in line]
    assert codes_of(diagnose_lines(without_stack)) == [UNKNOWN_FAILURE]


def test_a_hybrid_target_behind_a_plain_draft_model_still_carries_state() -> None:
    model = ModelEvidence()
    model.read("server_args={'model_path': 'Qwen/Qwen3-Next-80B-A3B-Instruct', "
               "'speculative_draft_model_path': 'lmsys/SGLang-EAGLE3-Llama-3.1-8B'}")  # fmt: skip
    model.read("Load weight end. type=LlamaForCausalLMEagle3, dtype=torch.bfloat16")
    assert model.recurrent is True and "Qwen3-Next" in model.describe()


def test_a_failed_state_transfer_is_a_failure_even_when_the_server_goes_on_serving() -> None:
    lines = [
        "[2026-11-30 15:00:00 TP0] Unexpected transfer worker error for room 5521",
        "Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 1692, in process_prefill_transfers',
        "RuntimeError: Hybrid SSM state geometry differs between prefill and decode",
        "[2026-11-30 15:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 300, #cached-token: 0, #queue-req: 0",
        '[2026-11-30 15:00:02] INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK',
    ]
    (f,) = diagnose_lines(lines)
    assert f.code == "PD_STATE_MISMATCH" and f.basis[0].startswith("message family: PD state transfer")
