"""`verify basic`: the server answers, streaming works, and what it serves is what config.toml says.

Greedy decoding makes the streamed and the non-streamed answer to the same prompt token-identical, so comparing them
checks the streaming path end to end, not only that some bytes arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridctl.config.schema import HybridConfig
from hybridctl.verify.client import SGLangClient, StreamResult
from hybridctl.verify.report import CheckResult
from hybridshared.units import format_ms, format_value

PROBE_PROMPT = "The three primary colors are"
PROBE_TOKENS = 8


def same_model_path(served: str, configured: str) -> bool:
    """Paths compare resolved: a relative config path and the server's absolute one name the same model."""
    if served == configured:
        return True
    try:
        return Path(served).expanduser().resolve() == Path(configured).expanduser().resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python 3.11's resolve)
        return False


def expected_server_args(config: HybridConfig) -> dict[str, Any]:
    """`/server_info` keys (SGLang's names) and the values config.toml + settings.json imply for them."""
    expected: dict[str, Any] = {"disable_radix_cache": not config.prefix_cache_enabled}
    spec = config.config.speculative
    if config.speculative_enabled:
        expected["speculative_algorithm"] = spec.speculative_algorithm
        expected["speculative_num_steps"] = spec.speculative_num_steps
        expected["speculative_eagle_topk"] = spec.speculative_topk
    else:
        expected["speculative_algorithm"] = None
    runtime = config.settings.runtime
    expected["chunked_prefill_size"] = runtime.chunked_prefill_size
    if runtime.max_running_requests is not None:
        expected["max_running_requests"] = runtime.max_running_requests
    expected["schedule_policy"] = runtime.schedule_policy
    return expected


# Limits the server may lower while resolving its arguments (SGLang caps max_running_requests by what the
# state pool holds): a smaller value is the server being honest about capacity, not another config.
CAPPED_KEYS = frozenset({"max_running_requests"})
# Keys a server may leave unset (None) and derive at run time, as SGLang's None means "derive it".
DERIVED_KEYS = frozenset({"max_running_requests", "chunked_prefill_size", "speculative_num_steps",
                          "speculative_eagle_topk"})  # fmt: skip
_NO_SPEC = (None, "", "none", "None", "NONE")


def compare_server_args(server_info: dict[str, Any], expected: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(mismatches, notes): a different value is a mismatch; an unreported key or a capped limit is a note."""
    mismatches: list[str] = []
    notes: list[str] = []
    for key, want in expected.items():
        got = server_info.get(key)
        if key == "speculative_algorithm" and want is None and got in _NO_SPEC:
            continue  # off in the config, and the server reports none (or does not report the key at all)
        if key not in server_info:
            notes.append(f"/server_info does not report {key}; not compared")
            continue
        if key in DERIVED_KEYS and got is None:
            notes.append(
                f"/server_info leaves {key} unset (derived at run time); the config asks for {format_value(want)}"
            )
            continue
        if key in CAPPED_KEYS and isinstance(got, int) and isinstance(want, int) and got < want:
            notes.append(f"the server capped {key} to {got} (the config asks for {want}): that is what its pools hold")
            continue
        if got != want:
            mismatches.append(f"{key}: server has {format_value(got)}, the config implies {format_value(want)}")
    return mismatches, notes


@dataclass
class _Findings:
    """What the checks found, in the order they ran: problems (the check fails), notes, measurements."""

    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)


def run_basic(client: SGLangClient, config: HybridConfig | None) -> CheckResult:
    found = _Findings()
    _check_health(client, found)
    _check_model(client, config, found)
    plain = _check_generate(client, found)
    streamed = _check_stream(client, plain, found)
    if found.reasons:
        summary = f"{len(found.reasons)} problem(s): {found.reasons[0]}"
        return CheckResult("basic", "failed", summary, found.reasons, found.notes, found.measurements)
    ttft = format_ms(found.measurements["stream"]["ttft_ms"])
    summary = f"server answers; streaming works ({streamed.chunks} chunks, TTFT {ttft}); model matches config"
    if config is None:
        summary = f"server answers; streaming works ({streamed.chunks} chunks, TTFT {ttft})"
    return CheckResult("basic", "passed", summary, found.reasons, found.notes, found.measurements)


def _check_health(client: SGLangClient, found: _Findings) -> None:
    status = client.health()
    found.measurements["health_status"] = status
    if status != 200:
        found.reasons.append(
            f"/health answered HTTP {status}, not 200: the server is up but not ready (still loading?)"
        )


def _check_model(client: SGLangClient, config: HybridConfig | None, found: _Findings) -> None:
    """A generation model, and with a config: the configured model, launched with the configured arguments."""
    info = client.model_info()
    found.measurements["model_info"] = {
        k: info.get(k)
        for k in (
            "model_path",
            "served_model_name",
            "tokenizer_path",
            "is_generation",
            "model_type",
            "architectures",
        )
    }
    if info.get("is_generation") is False:
        found.reasons.append("/model_info says is_generation=false: this is an embedding server, not a generator")
    if config is None:
        found.notes.append("no config.toml given: /model_info and /server_info were not compared with a config")
        return
    configured = config.config.server.model_path
    served = str(info.get("model_path") or "")
    if configured and not same_model_path(served, configured):
        found.reasons.append(
            f"/model_info model_path is {served!r} but config.toml [server] model_path is "
            f"{configured!r}: "
            "the server at this URL serves another model (wrong port, or the config was edited since: "
            "restart it with `hybridctl stop` then `hybridctl launch`)"
        )
    server_info = client.server_info()
    mismatches, arg_notes = compare_server_args(server_info, expected_server_args(config))
    found.notes.extend(arg_notes)
    found.reasons.extend(
        # launch refuses while this config's server runs, so the restart is stop, then launch.
        f"/server_info {m} — restart the server on this config: `hybridctl stop`, then `hybridctl launch`"
        for m in mismatches
    )


def _check_generate(client: SGLangClient, found: _Findings) -> dict[str, Any]:
    """The non-streamed greedy answer to the probe prompt (the stream is compared with it)."""
    plain = client.generate(PROBE_PROMPT, max_new_tokens=PROBE_TOKENS)
    meta = plain["meta_info"]
    missing = [k for k in ("prompt_tokens", "completion_tokens", "finish_reason") if k not in meta]
    if missing:
        found.reasons.append(f"/generate meta_info lacks {', '.join(missing)} (SGLang always sends them)")
    if int(meta.get("completion_tokens", 0) or 0) < 1:
        found.reasons.append("/generate produced no tokens (completion_tokens is 0)")
    return plain


def _check_stream(client: SGLangClient, plain: dict[str, Any], found: _Findings) -> StreamResult:
    """The same request streamed: well-formed, and token-identical to the non-streamed answer."""
    meta = plain["meta_info"]
    streamed = client.generate_stream(PROBE_PROMPT, max_new_tokens=PROBE_TOKENS)
    found.measurements["stream"] = {
        "chunks": streamed.chunks,
        "ttft_ms": None if streamed.ttft_s is None else round(streamed.ttft_s * 1000, 2),
        "e2e_ms": round(streamed.e2e_s * 1000, 2),
        "completion_tokens": streamed.completion_tokens,
    }
    reasons = found.reasons
    if streamed.chunks == 0:
        reasons.append("streamed /generate sent no `data:` chunks")
    elif not streamed.saw_done:
        reasons.append("streamed /generate did not end with `data: [DONE]`")
    if streamed.ttft_s is None:
        reasons.append("streamed /generate never reported a first token (completion_tokens stayed 0)")
    plain_text = str(plain.get("text", ""))
    if streamed.completion_tokens != int(meta.get("completion_tokens", 0) or 0):
        reasons.append(
            f"greedy stream produced {streamed.completion_tokens} tokens, the same request without streaming "
            f"{meta.get('completion_tokens')}: streaming and non-streaming paths disagree"
        )
    elif plain_text not in (streamed.text, "".join(streamed.text_pieces)):
        reasons.append(
            f"greedy stream text {streamed.text!r} differs from the non-streamed {plain_text!r}: "
            "streaming and non-streaming paths disagree"
        )
    return streamed
