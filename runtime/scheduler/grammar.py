"""Structured output: grammars (JSON schema, regex, EBNF) compiled by llguidance, masks applied per sampled token.

The grammar engine is llguidance (SGLang's `--grammar-backend llguidance`); this module never parses a grammar
itself. The server compiles a request's constraint before the request reaches the engine (`GrammarBackend`,
on a worker thread: a bad grammar is that request's 400, nothing else sees it). The scheduler then, for every
token a constrained request samples:

- masks the row's logits to the tokens the grammar allows next (`mask_logits`; the masks of all constrained rows
  of a batch are filled by llguidance's executor in parallel, outside the GIL),
- advances the grammar by the token it kept (`RequestGrammar.accept`), and only by that: speculative decoding
  checks drafts against the mask row by row and rolls back what it does not keep (`accept_drafts_constrained`),
  so the grammar state always equals the emitted prefix. Chunked prefill never touches the grammar (a grammar
  starts at the first output token).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from runtime.core.requests import SamplingParams

if TYPE_CHECKING:  # llguidance is imported when a grammar is first compiled, not with the scheduler
    from llguidance import LLExecutor, LLMatcher, LLTokenizer
    from llguidance._lib import JsonCompileOptions  # a TypedDict of its stubs only

GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")
_KEY_NAMES = {"json_schema": "json", "regex": "regex", "ebnf": "ebnf"}  # SGLang's grammar keys, in its errors
_CACHE_SIZE = 64  # compiled grammars kept for reuse (SGLang caches them by key too)


class GrammarError(ValueError):
    """A constraint that cannot be compiled (SGLang: "Failed to compile <kind> grammar: <why>")."""


class RequestGrammar:
    """One request's grammar state: an llguidance matcher advanced by the tokens the request emitted."""

    def __init__(self, matcher: LLMatcher, kind: str, source: str = "") -> None:
        self.matcher = matcher
        self.kind = kind
        self.source = source  # the constraint's text: what the process layout sends to the engine process
        self.consumed = 0  # tokens the matcher holds (what `rollback` may undo)

    def accept(self, token: int) -> bool:
        """Advance by an emitted token; True when the grammar was already complete (this token, the EOS its mask
        allowed, ends the request, as SGLang's `is_terminated`). Raises when the grammar cannot take it."""
        if self.matcher.is_stopped():
            return True
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the {self.kind} grammar rejected token {token}: {self.matcher.get_error()}")
        self.consumed += 1
        return False

    def rollback(self, tokens: int) -> None:
        if tokens > 0:
            self.matcher.rollback(tokens)
            self.consumed -= tokens

    def fork(self) -> RequestGrammar:
        """An independent copy in the same state (n > 1 continuations each need their own)."""
        copy = RequestGrammar(self.matcher.deep_copy(), self.kind, self.source)
        copy.consumed = self.consumed
        return copy

    @property
    def terminated(self) -> bool:
        """The grammar is complete and allows nothing but EOS."""
        return bool(self.matcher.is_stopped())


class GrammarBackend:
    """Compiles constraints for one tokenizer; compiled grammars are cached and copied per request."""

    def __init__(
        self,
        tokenizer_file: Path,
        vocab_size: int,
        eos_token_ids: list[int],
        *,
        any_whitespace: bool = True,
        whitespace_pattern: str | None = None,
    ) -> None:
        self.vocab_size = vocab_size
        # As SGLang's llguidance backend: JSON schemas allow free whitespace unless the server says otherwise.
        self.json_defaults: JsonCompileOptions = {
            "whitespace_flexible": any_whitespace,
            "whitespace_pattern": whitespace_pattern,
        }
        self._tokenizer_file = tokenizer_file
        self._eos_token_ids = eos_token_ids
        self._tokenizer: LLTokenizer | None = None
        self._cache: OrderedDict[tuple[str, str], LLMatcher] = OrderedDict()
        self._lock = threading.Lock()  # requests are parsed on several worker threads

    @classmethod
    def load(
        cls, tokenizer_dir: str | Path, vocab_size: int, eos_token_ids: list[int], **options: Any
    ) -> GrammarBackend:
        tokenizer_file = Path(tokenizer_dir) / "tokenizer.json"
        tokenizer_file.stat()  # a missing file fails here (OSError), at start-up, not at the first grammar
        return cls(tokenizer_file, vocab_size, eos_token_ids, **options)

    @property
    def tokenizer(self) -> LLTokenizer:
        """llguidance's view of the vocabulary, built by the first grammar compiled: ~15 MB resident for a
        150k-token vocabulary (real-size Qwen3-Next) that a server without structured-output requests never
        uses; the first one pays its ~60 ms build once."""
        with self._lock:
            if self._tokenizer is None:
                from llguidance import LLTokenizer

                try:
                    text = self._tokenizer_file.read_text(encoding="utf-8")
                    tokenizer = LLTokenizer(text, n_vocab=self.vocab_size, eos_token=self._eos_token_ids or None)
                except (OSError, ValueError, RuntimeError) as e:  # this request fails alone; the server stays up
                    raise GrammarError(
                        f"structured output is unavailable: llguidance cannot read {self._tokenizer_file}: {e}"
                    ) from None
                self._tokenizer = tokenizer
            return self._tokenizer

    def compile(self, kind: str, source: str) -> RequestGrammar:
        """A fresh grammar state for `source`; raises GrammarError with llguidance's reason."""
        from llguidance import LLMatcher, grammar_from

        key = (kind, source)
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
        if template is None:
            try:
                if kind == "json_schema":
                    json.loads(source)  # a clear message for text that is not JSON at all
                    serialized = LLMatcher.grammar_from_json_schema(source, defaults=self.json_defaults)
                elif kind == "regex":
                    serialized = grammar_from("regex", source)
                elif kind == "ebnf":
                    serialized = grammar_from("ebnf", source)
                else:
                    raise GrammarError(f"unknown grammar kind {kind!r}; expected one of {', '.join(GRAMMAR_KINDS)}")
            except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
                raise GrammarError(f"Failed to compile {_KEY_NAMES[kind]} grammar: {e}") from None
            template = LLMatcher(self.tokenizer, serialized, log_level=0)
            if template.is_error():
                raise GrammarError(f"Failed to compile {_KEY_NAMES[kind]} grammar: {template.get_error()}")
            with self._lock:
                self._cache[key] = template
                while len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        return RequestGrammar(template.deep_copy(), kind, source)


# -- masks -------------------------------------------------------------------------------------------------------

_BITS = torch.arange(32, dtype=torch.int32)
_executor: LLExecutor | None = None


def _mask_executor() -> LLExecutor:
    global _executor
    if _executor is None:
        from llguidance import LLExecutor

        _executor = LLExecutor()
    return _executor


def allowed_tokens(grammars: list[RequestGrammar], vocab: int) -> torch.Tensor:
    """[len(grammars), vocab] bool: the tokens each grammar allows next (filled in parallel, GIL released)."""
    words = (vocab + 31) // 32
    bitmask = torch.full((len(grammars), words), -1, dtype=torch.int32)
    _mask_executor().unsafe_compute_mask_ptr(
        [(g.matcher, i) for i, g in enumerate(grammars)], bitmask.data_ptr(), words * 4, len(grammars)
    )
    for g in grammars:
        if g.matcher.is_error():
            raise RuntimeError(f"the {g.kind} grammar failed: {g.matcher.get_error()}")
    bits = (bitmask.unsqueeze(-1) >> _BITS) & 1
    return bits.view(len(grammars), words * 32)[:, :vocab].bool()


def mask_isolated(
    logits: torch.Tensor, grammars: list[RequestGrammar | None]
) -> tuple[torch.Tensor, list[tuple[int, Exception]]]:
    """`mask_logits`, but a row whose grammar fails is left unmasked and reported instead of failing the batch."""
    try:
        return mask_logits(logits, grammars), []
    except Exception:  # noqa: BLE001 - find the grammar at fault row by row
        pass
    errors: list[tuple[int, Exception]] = []
    kept: list[RequestGrammar | None] = []
    for i, g in enumerate(grammars):
        try:
            if g is not None:
                allowed_tokens([g], logits.shape[-1])
            kept.append(g)
        except Exception as exc:  # noqa: BLE001
            errors.append((i, exc))
            kept.append(None)
    return mask_logits(logits, kept), errors


def mask_logits(logits: torch.Tensor, grammars: list[RequestGrammar | None]) -> torch.Tensor:
    """`logits` ([rows, vocab]) with every token the row's grammar forbids at -inf; rows without a grammar and
    the caller's tensor are left as they are (a copy is returned when anything is masked)."""
    rows = [i for i, g in enumerate(grammars) if g is not None]
    if not rows:
        return logits
    masked = logits.float().clone()
    allowed = allowed_tokens([g for g in grammars if g is not None], masked.shape[-1])
    masked[rows] = masked[rows].masked_fill(~allowed.to(masked.device), float("-inf"))
    return masked


# -- speculative decoding ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConstrainedRound:
    emitted: list[int]
    accepted_drafts: int
    logits: torch.Tensor  # the masked rows that decided each emitted token ([len(emitted), vocab])
    consumed_after: list[int]  # the grammar's consumed count after each emitted token
    ended: bool  # the last emitted token came after the grammar was complete (it ends the request)

    def rollback_to(self, grammar: RequestGrammar, kept: int) -> None:
        """Undo the emitted tokens past the first `kept` (the round stopped early at EOS or a stop string)."""
        if 0 < kept < len(self.emitted):
            grammar.rollback(grammar.consumed - self.consumed_after[kept - 1])


def accept_drafts_constrained(
    drafts: list[int],
    logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    grammar: RequestGrammar,
) -> ConstrainedRound:
    """Verify drafts for a constrained request: row j is masked with the grammar advanced over the drafts
    accepted before it, the target's token is drawn from the masked row, and the draft is kept while it equals
    that token (as `accept_drafts`, one row at a time). On return the grammar is advanced by every emitted
    token; the caller rolls back the ones it does not keep (a stop inside the round)."""
    from runtime.scheduler.sampling import sample

    emitted: list[int] = []
    rows: list[torch.Tensor] = []
    consumed_after: list[int] = []
    accepted = 0
    ended = False
    for j in range(len(drafts) + 1):
        row = mask_logits(logits[j : j + 1], [grammar])
        target = sample(row, [sampling], [generator])[0]
        rows.append(row[0])
        emitted.append(target)
        ended = grammar.accept(target)
        consumed_after.append(grammar.consumed)
        if ended or j == len(drafts) or drafts[j] != target:
            break
        accepted += 1
    return ConstrainedRound(emitted, accepted, torch.stack(rows), consumed_after, ended)
