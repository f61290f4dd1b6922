"""Prompts of a known length: exact token ids when the model's tokenizer.json is readable, text otherwise.

With a tokenizer the document is sent as `input_ids`, so "a document of N tokens" is exactly N tokens and the shared
prefix between two prompts is exactly the document (no merge across the document/question boundary). Without one (no
`tokenizers` package, or the model directory is on another host) prompts are plain text and the document length is an
estimate, calibrated afterwards from the server's own `prompt_tokens`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Common English words: documents read like (meaningless) prose, which tokenizes like real text.
_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an have not they which "
    "one you were "
    "all her she there would their we him been has when who will more no if out so said what up its "
    "about into than "
    "them can only other new some could time these two may then do first any my now such like our over "
    "man me even "
    "most made after also did many before must through back years where much your way well down should "
    "because each "
    "just those people how too little state good very make world still own see men work long get here "
    "between both "
    "life being under never day same another know while last might us great old year off come since "
    "against go came "
    "right used take three memory cache state prefix model layer token request server decode prefill "
    "attention "
    "recurrent hybrid pool slot radix tree snapshot latency throughput batch stream answer question document"
).split()

# Rough tokens per English word for BPE vocabularies; only used when no tokenizer is available.
_TOKENS_PER_WORD = 1.3


@dataclass(frozen=True)
class TokenizerInfo:
    path: str
    vocab_size: int


class PromptBuilder:
    """Builds documents and questions; `exact` says whether lengths are exact token counts."""

    def __init__(self, tokenizer: Any | None = None, info: TokenizerInfo | None = None) -> None:
        self._tok = tokenizer
        self.info = info

    @property
    def exact(self) -> bool:
        return self._tok is not None

    def _text(self, n_words: int, rng: random.Random) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n_words))

    def document(self, n_tokens: int, seed: int) -> str | list[int]:
        rng = random.Random(f"doc-{seed}")
        if self._tok is None:
            return "Document:\n" + self._text(max(1, int(n_tokens / _TOKENS_PER_WORD)), rng)
        ids: list[int] = []
        while len(ids) < n_tokens:
            ids.extend(self._tok.encode(self._text(256, rng) + " ", add_special_tokens=False).ids)
        return ids[:n_tokens]

    def question(self, n_tokens: int, seed: int) -> str | list[int]:
        rng = random.Random(f"question-{seed}")
        # The random words come first so that two questions differ from their first token on: the shared
        # prefix
        # between two prompts on one document is then exactly the document.
        if self._tok is None:
            return f"\n{self._text(max(1, int(n_tokens / _TOKENS_PER_WORD)), rng)}? Answer:"
        ids: list[int] = []
        while len(ids) < n_tokens:
            ids.extend(self._tok.encode(self._text(32, rng), add_special_tokens=False).ids)
        return ids[:n_tokens]

    def join(self, document: str | list[int], question: str | list[int]) -> str | list[int]:
        if isinstance(document, list) and isinstance(question, list):
            return document + question
        return f"{document}{question}"

    def count(self, prompt: str | list[int]) -> int:
        """Exact length for ids; for text an estimate (calibrate with the server's prompt_tokens)."""
        if isinstance(prompt, list):
            return len(prompt)
        if self._tok is not None:
            return len(self._tok.encode(prompt, add_special_tokens=False).ids)
        return max(1, round(len(prompt.split()) * _TOKENS_PER_WORD))


def load_prompt_builder(candidates: list[str | None]) -> tuple[PromptBuilder, str]:
    """A builder from the first readable `tokenizer.json` among the candidate directories, and a note saying
    which.

    `tokenizers` is optional (the runtime extra installs it); it is a Rust library, not torch.
    """
    dirs = [Path(c) for c in candidates if c]
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return (
            PromptBuilder(),
            "the `tokenizers` package is not installed: prompts are text, lengths estimated",
        )
    for directory in dirs:
        path = directory / "tokenizer.json" if directory.is_dir() else directory
        if path.name == "tokenizer.json" and path.is_file():
            try:
                tok = Tokenizer.from_file(str(path))
            except Exception as exc:  # the tokenizers library raises its own Exception subclass
                return (
                    PromptBuilder(),
                    f"{path} could not be read ({exc}): prompts are text, lengths estimated",
                )
            info = TokenizerInfo(path=str(path), vocab_size=tok.get_vocab_size())
            return PromptBuilder(tok, info), f"exact token ids from {path}"
    looked = ", ".join(str(d) for d in dirs) or "none given"
    return (
        PromptBuilder(),
        f"no tokenizer.json found (looked in: {looked}): prompts are text, lengths estimated",
    )
