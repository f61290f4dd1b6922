"""A real Qwen3-Next checkpoint whose greedy output is a script: tool calls and think blocks on cue.

Random weights never emit a tool call, so the tools/reasoning tests drive the output instead of mocking it:
every mixer's output projection and every MLP's down projection are zero, so the residual stream is the
current token's embedding and the next token depends on the current one only (a bigram model). Scripted tokens
(added to the tokenizer, as Qwen's `<tool_call>` and `<think>` are) get one-hot embeddings and an LM-head row
that points the chain to the next token. The server, sampler, detokenizer and parsers all run as usual.
The chat template is Qwen3's shape: `tools` in the system turn, `<think>` opened by the generation prompt
unless `enable_thinking` is false (Qwen3.5 writes `<think>\\n`; the scripted trigger is the marker itself).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from runtime.demo_model import build_demo_model

CALL_JSON = '\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
# What a grammar-forced tool_choice (required / named) makes of the same call: SGLang's JSON array of calls.
CALL_ARRAY = '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}]'
REASONING = "Let me think about the weather."
ANSWER = "The answer is 42."
PREFIX = "Let me continue"
CONTINUATION = " the sentence."
EOS = "<|im_end|>"
# Thinking on: <think> -> reasoning -> </think> -> a tool call -> end.
# Thinking off (the generation prompt ends "<think>\n\n</think>\n\n"): the answer -> end.
# continue_final_message with the assistant text PREFIX: the continuation -> end.
# Under a grammar that masks the reasoning (tool_choice required / named with the grammar engine), the next best
# token after <think> is the whole call array, then the end (RUNNER_UP: a lower logit than the chain's).
CHAINS = [
    ["<think>", REASONING, "</think>", "<tool_call>", CALL_JSON, "</tool_call>", EOS],
    ["<|no_think|>", ANSWER, EOS],
    [PREFIX, CONTINUATION, EOS],
    [CALL_ARRAY, EOS],
]
RUNNER_UP = [("<think>", CALL_ARRAY)]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", REASONING, CALL_JSON, ANSWER, PREFIX, CONTINUATION,
         "<|no_think|>", CALL_ARRAY]  # fmt: skip

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n"
    'For each call, return <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    "<|im_end|>{{ '\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>{{ '\\n' }}"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>"
    "{{ '\\n' }}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n<|no_think|>"
    "{% else %}<think>{% endif %}{% endif %}"
)


def build_scripted_model(out: Path) -> Path:
    """The demo Qwen3-Next made a bigram script follower (see the module docstring)."""
    from tokenizers import AddedToken, Tokenizer

    build_demo_model(out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_tokens([AddedToken(text, normalized=False, special=False) for text in ADDED])
    tok.save(str(out / "tokenizer.json"))
    ids = {text: tok.token_to_id(text) for text in {t for chain in CHAINS for t in chain}}
    assert max(ids.values()) < json.loads((out / "config.json").read_text())["vocab_size"]
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))

    w = load_file(str(out / "model.safetensors"))
    hidden = w["model.embed_tokens.weight"].shape[1]
    for name, t in w.items():
        if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            w[name] = torch.zeros_like(t)
    w["model.norm.weight"] = torch.zeros(hidden)  # Qwen3-Next's norms scale by 1 + weight
    embed, head = w["model.embed_tokens.weight"].clone(), w["lm_head.weight"].clone()
    slots: dict[int, int] = {}
    for chain in CHAINS:
        for cur, nxt in zip(chain, chain[1:], strict=False):
            slot = slots.setdefault(ids[cur], len(slots))
            embed[ids[cur]] = 0.0
            embed[ids[cur], slot] = 1.0
            head[ids[nxt], slot] += 50.0
    for cur, nxt in RUNNER_UP:
        head[ids[nxt], slots[ids[cur]]] += 25.0
    w["model.embed_tokens.weight"], w["lm_head.weight"] = embed.contiguous(), head.contiguous()
    save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
