"""Does the logged model carry recurrent state at all? Read from the log itself.

The five failure codes are about a hybrid model's recurrent (Mamba / linear-attention) state. Several of the
messages that reveal them are shared with models that have none: "PD Disaggregation does NOT support PD different
TP sizes" is raised for sliding-window hybrids (GPT-OSS) too, an out-of-memory at start-up can be any pool's, the
radix cache is disabled for any model. So a finding needs to know the model, and the log says it in several
places, most reliable first:

1. the engine's own pools: `Mamba Cache is allocated`, `conv_state size`, `Tree cache initialized: ...
   hybrid_ssm=True` (state exists) or `hybrid_ssm=False` (it does not);
2. the architecture class it loaded (`type=Qwen3NextForCausalLM`, `architectures=['GptOssForCausalLM']`, or named
   inside a message);
3. the model path (`server_args`, `--model-path`).

`ModelEvidence.recurrent` is True, False, or None when the log does not say; `why` names the line it rests on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Families whose layers keep a recurrent state per request (Mamba, GDN/KDA linear attention, short conv, RWKV).
_RECURRENT = re.compile(
    r"qwen3[-_.]?next|qwen3[-_.]?coder[-_.]?next|qwen3[._][5-9](?!\d)|kimi[-_.]?linear|kimi[-_.]?k3"
    r"|nemotron[-_.]?h\b|nemotronh|nemotron[-_.]?nano[-_.]?(?:9b|12b)|nemotron[-_.]?3|falcon[-_.]?h1|falconh1"
    r"|falcon[-_.]?mamba|granite[-_.]?4|granitemoehybrid|jamba|mamba|zamba|bamba|minimax[-_.]?(?:m1|text|01)"
    r"|minimaxm1|minimaxtext|lfm2|plamo[-_.]?2|hymba|rwkv|recurrentgemma|ling[-_.]?linear|bailing\w*linear"
    r"|linear[-_.]?attention|gated[-_.]?deltanet|\bgdn\b|\bkda\b|olmo[-_.]?hybrid|hunyuan[-_.]?t1",
    re.IGNORECASE,
)
# Families without one (full, sliding-window or MLA attention only).
_STATELESS = re.compile(
    r"gpt[-_.]?oss|gptoss|llama|qwen[-_.]?2|qwen3(?![-_.]?(?:next|coder[-_.]?next)|[._][5-9](?!\d))|qwq"
    r"|deepseek|mistral|mixtral|gemma(?![-_.]?recurrent)|\bphi[-_.]?\d|glm[-_.]?4|glm[-_.]?5|kimi[-_.]?k2"
    r"|command[-_.]?r|cohere|olmo(?![-_.]?hybrid)|internlm|baichuan|\byi[-_.]|gpt2|starcoder|exaone|minicpm"
    r"|granite[-_.]?3|opt[-_.]\d|bloom|falcon[-_.]?(?:7b|40b|180b)|seed[-_.]?oss|step3|ernie|smollm",
    re.IGNORECASE,
)
_ARCH_CLASS = re.compile(r"\b([A-Z][A-Za-z0-9_]*For(?:CausalLM|ConditionalGeneration|Generation))\b")
_MODEL_PATH = re.compile(r"""(?:['"]?model_path['"]?\s*[:=]\s*['"]?|--model(?:-path)?[ =]+)(?P<path>[^'",\s)]+)""")
_ENGINE_STATE = re.compile(
    r"Mamba Cache is allocated|conv_state size|ssm_state size|hybrid_ssm=True|sub-pool '(?:mamba|ssm|state)'", re.I
)
_MAX_NAMES = 16
_ENGINE_NO_STATE = re.compile(r"hybrid_ssm=False")
# An engine message about sliding-window hybrids: "... for non-MLA SWA hybrid models yet".
_SWA_ONLY = re.compile(
    r"\b(?:for|with) (?:TP-mismatched )?(?:non-MLA )?(?:SWA|sliding[- ]window)(?: hybrid)? models?\b", re.IGNORECASE
)


def classify(name: str) -> bool | None:
    """True for a recurrent family, False for one without state, None when the name says neither."""
    if _RECURRENT.search(name):
        return True
    if _STATELESS.search(name):
        return False
    return None


@dataclass
class ModelEvidence:
    engine: bool | None = None  # the engine's pools or tree cache said so
    engine_line: str = ""
    names: list[tuple[str, str]] = field(default_factory=list)  # ("architecture" | "model path", name), as logged
    swa_hint: bool = False  # an engine message spoke of SWA hybrids

    def read(self, message: str) -> None:
        if self.engine is not True and _ENGINE_STATE.search(message):
            self.engine, self.engine_line = True, message.strip()[:160]
        elif self.engine is None and _ENGINE_NO_STATE.search(message):
            self.engine, self.engine_line = False, message.strip()[:160]
        if len(self.names) < _MAX_NAMES:
            found = [("architecture", m.group(1)) for m in _ARCH_CLASS.finditer(message)]
            found += [("model path", m.group("path")) for m in _MODEL_PATH.finditer(message)]
            self.names += [n for n in found if n not in self.names]
        if _SWA_ONLY.search(message):
            self.swa_hint = True

    def _deciding(self) -> tuple[str, str, bool] | None:
        """The name the verdict rests on: any recurrent family (a hybrid target behind a plain draft model
        still carries state), else a family without state."""
        known = [(what, name, v) for what, name in self.names if (v := classify(name)) is not None]
        return next((k for k in known if k[2]), known[0] if known else None)

    @property
    def recurrent(self) -> bool | None:
        if self.engine is not None:
            return self.engine
        if (deciding := self._deciding()) is not None:
            return deciding[2]
        return False if self.swa_hint else None

    def why(self) -> str:
        """The line the verdict rests on, in words."""
        if self.engine is not None:
            return f"the engine logged '{self.engine_line}'"
        if (deciding := self._deciding()) is not None:
            what, name, verdict = deciding
            family = "a recurrent-state family" if verdict else "a family without recurrent state"
            return f"{what} {name} is {family}"
        if self.swa_hint:
            return "the engine's message is about sliding-window (SWA) hybrids, which keep no recurrent state"
        return "the log does not name the model"

    def describe(self) -> str:
        """`model: X (recurrent state: yes; why)` for a finding's evidence list."""
        deciding = self._deciding()
        name = deciding[1] if deciding else self.names[0][1] if self.names else "model not named in the log"
        state = {True: "yes", False: "no", None: "unknown"}[self.recurrent]
        return f"model: {name} (recurrent state: {state}; {self.why()})"
