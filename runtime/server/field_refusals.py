"""Request fields SGLang 0.5.23 has and the bundled runtime does not implement: accepted only at the values that
change nothing, refused with a 400 naming the field otherwise (never silently ignored).

The tables here are the fields no other part of the request parser looks at; docs/runtime-api.md lists every
SGLang request field with its status, and tests/runtime/test_request_fields.py sends each refused row.
"""

from __future__ import annotations

from typing import Any

from runtime.server.generate_request import RequestValueError, short_repr

_OFF = (None, False)
_UNSET = (None,)
_EMPTY: tuple[object, ...] = (None, "", [], {})

# Top-level fields of /generate (GenerateReqInput) beyond those generate_request.py handles.
GENERATE_REFUSED: dict[str, tuple[Any, ...]] = {
    "token_ids_logprob": _UNSET,
    "return_hidden_states": _OFF,
    "image_data": _UNSET,
    "video_data": _UNSET,
    "audio_data": _UNSET,
    "lora_path": _UNSET,
    "session_params": _UNSET,
    "custom_logit_processor": _UNSET,
    "return_prompt_token_ids": _OFF,
    "input_embeds": _UNSET,
    "mm_hashes": _UNSET,
    "mm_content_hashes": _UNSET,
    "use_audio_in_video": _OFF,
    "video_config": _UNSET,
    "watermark": _UNSET,
    "return_sampling_mask": _OFF,
    "sampling_logprobs_mode": _UNSET,
    "return_flat_raw_top_logprobs": _OFF,
    "return_flat_raw_output_top_logprobs": _OFF,
    "return_flat_raw_top_logprobs_b64": _OFF,
    "return_routed_experts": _OFF,
    "routed_experts_start_len": (None, 0),
    "return_indexer_topk": _OFF,
    "modalities": _EMPTY,
    "lora_id": _UNSET,
    "positional_embed_overrides": _UNSET,
    "decode_tp_size": (None, 1),
    "background": _OFF,
    "require_reasoning": _OFF,
    "max_thinking_tokens": _UNSET,
    "extra_key": _EMPTY,
    "cache_salt": _EMPTY,
    "return_bytes": _OFF,
    "return_entropy": _OFF,
    "encoder_urls": _EMPTY,
    "max_dynamic_patch": _UNSET,
    "min_dynamic_patch": _UNSET,
    "image_max_dynamic_patch": _UNSET,
    "video_max_dynamic_patch": _UNSET,
    "images_config": _UNSET,
    "mm_processor_kwargs": _EMPTY,
    "multi_item_delimiter_indices": _UNSET,
    "token_indices_to_pool": _UNSET,
    "kv_hints": _UNSET,
    "session_id": _UNSET,
}

# Fields of both OpenAI routes (CompletionRequest and ChatCompletionRequest) nothing else reads.
OPENAI_REFUSED: dict[str, tuple[Any, ...]] = {
    "return_hidden_states": _OFF,
    "return_routed_experts": _OFF,
    "routed_experts_start_len": (None, 0),
    "return_spec_tokens_details": _OFF,
    "return_token_ids": _OFF,
    "stop_regex": _EMPTY,
    "lora_path": _UNSET,
    "session_id": _UNSET,
    "session_params": _UNSET,
    "custom_params": _EMPTY,
    "custom_logit_processor": _UNSET,
    "watermark": _UNSET,
    "images_config": _UNSET,
    "mm_processor_kwargs": _EMPTY,
    "extra_key": _EMPTY,
    "cache_salt": _EMPTY,
}

COMPLETIONS_REFUSED: dict[str, tuple[Any, ...]] = {
    "suffix": (None, ""),
}

CHAT_REFUSED: dict[str, tuple[Any, ...]] = {
    "return_prompt_token_ids": _OFF,
    "return_meta_info": _OFF,
    "return_input_ids_in_sglext": _OFF,
    "return_output_ids_in_sglext": _OFF,
    "return_sampling_mask": _OFF,
    "sampling_logprobs_mode": _UNSET,
    "return_flat_raw_output_top_logprobs": _OFF,
    "return_flat_raw_top_logprobs_b64": _OFF,
    "reasoning_effort": _UNSET,
    "thinking": _UNSET,
    "task": _UNSET,
    "max_dynamic_patch": _UNSET,
    "min_dynamic_patch": _UNSET,
    "use_audio_in_video": _OFF,
    "video_config": _UNSET,
    "input_ids": _UNSET,
}


def refuse_unimplemented(body: dict[str, Any], *tables: dict[str, tuple[Any, ...]]) -> None:
    """RequestValueError naming the first field of `tables` the body sets to a value that would change the answer."""
    for table in tables:
        for key, neutral in table.items():
            if key in body and body[key] not in neutral:
                accepted = ", ".join(repr(v) for v in neutral if v is not None) or "null"
                raise RequestValueError(
                    f"{key}={short_repr(body[key])} is not implemented by the bundled runtime (accepted: {accepted})"
                )
