"""Message families: a failure recognised by what its message is about, not by its exact words.

Releases reword their messages (0.5.2x's "MambaComponent requires page_size=1 ..." for 0.5.4's "Only support
page_size=1 in mamba radix cache now."), plugins and forks add their own, and a new kernel brings a new refusal.
What stays is the shape: each of the five failures is a statement about the recurrent state (mamba, ssm, GDN,
KDA, linear attention, ...) in one setting (speculative verify, the prefix cache, the PD transfer, the elastic
pool, the state pool) that says something could not be done (requires, does not support, mismatch, too small).
A family below is those three word classes; a message carries the family when it has all three. The setting
may also come from where the exception was raised (the frames' modules: `disaggregation/`, `speculative/`,
`mem_cache/mamba_radix_cache`, ...). When only some of the three are there, the family is the nearest code of
an UNKNOWN_FAILURE, and the missing part is the reason it was not assigned. A traceback whose message says too
little for any family ("AssertionError", "'NoneType' object ...") is left to the signatures (log_signatures.py).

Families are tried in the order of the message patterns (most specific setting first): a message about the
PD transfer of a state is PD_STATE_MISMATCH even though it also names the state pool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The recurrent state, in every name releases, kernels and plugins give it.
_STATE = (
    r"mamba|\bssm\b|ssm_state|conv_state|recurrent|linear[- _]attn|linear[- ]attention|\bGDN\b|\bKDA\b"
    r"|intermediate_ssm|hybrid_ssm|state (?:slot|pool|cache|index|indices|transfer)|\bstates?\b"
)
# Things that are broken installs or unsupported hardware, whatever their words: never one of the five.
_NOT_A_MODE = re.compile(
    r"\b(?:unavailable|not available|not installed|No module named|requires SM\d|requires CUDA|requires Intel"
    r"|must divide|cannot be split|not divisible by (?:tp|the tensor)|install\w*|libcuda|driver version)\b",
    re.IGNORECASE,
)
_CONSTRAINT = (
    r"requires?|needs?|must|only supports?|does not support|doesn't support|do not support|not supported"
    r"|unsupported|not compatible|incompatible|not verified|cannot|can ?not|can't|mismatch\w*|differ\w*"
    r"|failed|failure|timed out|timeout|too small|not enough|exhausted|out of memory|no free|expected|got \d"
    r"|has no attribute|reject\w*"
)


@dataclass(frozen=True)
class Family:
    code: str
    name: str
    setting: re.Pattern[str]  # what the message is about (or the frames' modules)
    state: re.Pattern[str]
    constraint: re.Pattern[str]
    cause: str
    remedy: str


def _f(code: str, name: str, setting: str, cause: str, remedy: str, state: str = _STATE) -> Family:
    flags = re.IGNORECASE
    return Family(code, name, re.compile(setting, flags), re.compile(state, flags),
                  re.compile(_CONSTRAINT, flags), cause, remedy)  # fmt: skip


FAMILIES: tuple[Family, ...] = (
    _f(
        "PD_STATE_MISMATCH",
        "PD state transfer",
        r"\bPD\b|prefill[/ ]+(?:and )?decode|prefill\b.{0,40}\bdecode|disaggregation|\btransfer|bootstrap|nixl"
        r"|mooncake|\bmori\b|kv_?sender|kv_?receiver|replicat\w+",
        "The prefill and decode servers could not hand a request's recurrent state over: the two sides lay it "
        "out differently (TP size, state dtype, replication) or the transfer backend refused it.",
        "pd_match_peer",
    ),
    _f(
        "ELASTIC_TIMEOUT",
        "elastic / virtual-memory pool",
        r"unified[- _]memory|unified[- _]?(?:kv)?[- _]?pool|\bVMM\b|cuda_vmm|cuMem\w*|kvcached|torch_memory_saver"
        r"|memory_saver|elastic|fd exchange|\bIMEX\b|FABRIC handles?|resume_memory_occupation|expandable",
        "An elastic / virtual-memory pool (SGLang's unified memory, kvcached, torch_memory_saver) could not "
        "map, share, resize or resume its pages.",
        "elastic_off",
        state=_STATE + r"|\bpages?\b|memory|\bpool\b|handles?|\bfds?\b|file descriptors?|rows?\b|alloc\w*",
    ),
    _f(
        "SPEC_ROLLBACK",
        "speculative verify",
        r"speculative|spec(?:ulative)?[- _]decod|target[_ ]verify|\bverify\b|\bdraft|\beagle\d?\b|\bmtp\b"
        r"|\bnextn\b|\bngram\b|dflash|topk|scratch",
        "Speculative decoding needs a scratch state per draft position to roll rejected drafts back; this "
        "model, kernel or cache layout cannot provide one.",
        "spec_extra_buffer",
    ),
    _f(
        "PREFIX_CACHE_MISS",
        "prefix (radix) cache of the state",
        r"radix|prefix[- _]cach|tree[_ ]cache|extra[-_]buffer|no_buffer|checkpoint|track(?:ing)?[_ ]"
        r"(?:interval|mask)|mamba_track|page[_ ]size|RadixCache|hicache|hierarchical|retraction|cache_chunk",
        "The prefix cache cannot keep this model's recurrent state at the points a later request would reuse "
        "(a page size, checkpoint interval, kernel or cache backend that keeps no state snapshots).",
        "enable_prefix_cache",
    ),
    _f(
        "MAMBA_POOL_ALLOC",
        "state pool",
        r"\bpool\b|\bslots?\b|max_mamba_cache_size|mamba[_ ]cache|state cache|alloc\w*|ping[- ]?pong|capacity",
        "The recurrent-state pool could not give a request a slot: it holds fewer slots than the requests "
        "need, or the memory for it was not there.",
        "grow_state_pool",
    ),
)

# Where an exception was raised says which setting it is about, even when its message does not.
_FRAME_SETTING: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (code, re.compile(p, re.IGNORECASE))
    for code, p in (
        ("PD_STATE_MISMATCH", r"\bdisaggregation\.|_send_mamba_state|maybe_send_extra|transfer_worker"),
        ("ELASTIC_TIMEOUT", r"kvcached|torch_memory_saver|cuda_vmm|unified_memory_pool|elastic"),
        ("SPEC_ROLLBACK", r"\bspeculative\.|target_verify|_verify\b|verify_|eagle|\bmtp\b"),
        ("PREFIX_CACHE_MISS", r"mamba_radix_cache|unified_cache\.components|radix_cache|match_prefix|registry"
                              r"\.create_tree_cache|hicache"),
        ("MAMBA_POOL_ALLOC", r"HybridReqToTokenPool|_init_mamba_pool|MambaPool|mamba_pool|_alloc_ping_pong"),
    )
)  # fmt: skip


@dataclass(frozen=True)
class FamilyMatch:
    family: Family
    parts: tuple[str, ...]  # the words that fit: setting, state, constraint
    missing: tuple[str, ...]  # what did not fit (empty: a full match)

    @property
    def full(self) -> bool:
        return not self.missing

    def describe(self) -> str:
        return f"{self.family.name} ({', '.join(self.parts)})"


def _word(m: re.Match[str] | None) -> str:
    return m.group(0).strip() if m else ""


def match_family(message: str, frames: str = "") -> FamilyMatch | None:
    """The first family the message (and, for the setting, the frames' modules) carries in full; else the
    family it fits best, with what is missing; None when it fits none at all."""
    if _NOT_A_MODE.search(message):
        return None
    best: FamilyMatch | None = None
    for fam in FAMILIES:
        setting = fam.setting.search(message)
        where = "message"
        if setting is None and frames:
            frame_hit = next((p.search(frames) for code, p in _FRAME_SETTING if code == fam.code), None)
            setting, where = frame_hit, "frames"
        # The state must be named by the message itself: every frame of a hybrid model's server passes through
        # mamba-named code, so frames naming it say nothing about what went wrong.
        state = fam.state.search(message)
        constraint = fam.constraint.search(message)
        parts = tuple(
            f"{what}: {_word(m)}" + (" (frames)" if what == "setting" and where == "frames" else "")
            for what, m in (("setting", setting), ("state", state), ("constraint", constraint)) if m
        )  # fmt: skip
        missing = tuple(what for what, m in (("setting", setting), ("state", state), ("constraint", constraint))
                        if m is None)  # fmt: skip
        if not missing:
            return FamilyMatch(fam, parts, ())
        if setting is not None and (best is None or len(missing) < len(best.missing)):
            best = FamilyMatch(fam, parts, missing)
    return best
