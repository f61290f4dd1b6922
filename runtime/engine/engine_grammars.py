"""Structured output in the engine process: a request's constraint arrives as text (`GrammarSpec`) and is
compiled here with the same options as the server's backend (which compiled it once already to answer a bad
grammar with a 400; both cache compiled grammars)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.engine.wire import GrammarSpec

if TYPE_CHECKING:
    from runtime.scheduler.grammar import GrammarBackend, RequestGrammar


class EngineGrammars:
    def __init__(self, options: dict[str, Any] | None) -> None:
        self._options = options
        self._backend: GrammarBackend | None = None

    def compile(self, spec: object) -> RequestGrammar:
        """The request's grammar state; ValueError when it cannot be compiled here."""
        if not isinstance(spec, GrammarSpec):
            raise ValueError(f"structured output: expected a grammar spec, got {type(spec).__name__}")
        if self._options is None:
            raise ValueError("structured output is off (--grammar-backend none)")
        if self._backend is None:
            from runtime.scheduler.grammar import GrammarBackend

            options = dict(self._options)
            self._backend = GrammarBackend.load(options.pop("tokenizer_dir"), **options)
        return self._backend.compile(spec.kind, spec.source)
