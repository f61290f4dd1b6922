"""The server's tokenizer: text in, text out, and the chat template, from a Hugging Face tokenizer directory.

Reads `tokenizer.json` with the `tokenizers` library and `tokenizer_config.json` (special tokens, whether to
add a BOS token, the Jinja chat template) the way transformers does, without importing transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class TokenizerLoadError(ValueError):
    """The tokenizer directory is missing a file or holds one that cannot be read."""


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens either as a string or as an AddedToken dict.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


@dataclass
class ServerTokenizer:
    path: Path
    _tok: Tokenizer
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    add_bos_token: bool
    _max_token_bytes: int | None = None

    @classmethod
    def load(cls, path: str | Path) -> ServerTokenizer:
        from tokenizers import Tokenizer

        directory = Path(path)
        tok_file = directory / "tokenizer.json"
        if not tok_file.is_file():
            raise TokenizerLoadError(
                f"{tok_file} not found: the runtime needs a Hugging Face fast tokenizer (tokenizer.json); "
                "pass --tokenizer-path to a directory that has one"
            )
        try:
            tok = Tokenizer.from_file(str(tok_file))
        except Exception as e:  # the tokenizers library raises its own exception types
            raise TokenizerLoadError(f"{tok_file}: cannot be read as a tokenizer ({e})") from None
        cfg: dict[str, Any] = {}
        cfg_file = directory / "tokenizer_config.json"
        if cfg_file.is_file():
            try:
                cfg = json.loads(cfg_file.read_text())
            except json.JSONDecodeError as e:
                raise TokenizerLoadError(f"{cfg_file}: invalid JSON at line {e.lineno}: {e.msg}") from None
        template = cfg.get("chat_template")
        template_file = directory / "chat_template.jinja"
        if template is None and template_file.is_file():
            template = template_file.read_text()
        if isinstance(template, list):  # a list of named templates: transformers takes "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return cls(
            path=directory,
            _tok=tok,
            chat_template=template if isinstance(template, str) else None,
            bos_token=_token_text(cfg.get("bos_token")),
            eos_token=_token_text(cfg.get("eos_token")),
            add_bos_token=bool(cfg.get("add_bos_token", False)),
        )

    @property
    def max_token_bytes(self) -> int:
        """UTF-8 bytes of the longest vocabulary entry: no token covers much more text than that."""
        if self._max_token_bytes is None:
            vocab = self._tok.get_vocab(with_added_tokens=True)
            self._max_token_bytes = max((len(t.encode("utf-8", "replace")) for t in vocab), default=1)
        return self._max_token_bytes

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        # encode_batch, not encode: the tokenizers binding releases the GIL only in the batch call, and a long
        # prompt held it for seconds on a worker thread (the event loop, /health included, stood still).
        ids = list(self._tok.encode_batch([text], add_special_tokens=False)[0].ids)
        if self.add_bos_token and self.bos_token is not None:
            bos = self._tok.token_to_id(self.bos_token)
            if bos is not None and (not ids or ids[0] != bos):
                ids.insert(0, bos)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_id(self, token: str) -> int | None:
        found = self._tok.token_to_id(token)
        return None if found is None else int(found)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Render OpenAI chat messages to the prompt text, as transformers' apply_chat_template does: `tools`
        and the request's `chat_template_kwargs` (e.g. enable_thinking) are template variables."""
        if self.chat_template is None:
            raise ValueError(
                f"the tokenizer at {self.path} has no chat template (tokenizer_config.json 'chat_template'); "
                "use /v1/completions or /generate with a plain prompt"
            )
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = raise_exception
        try:
            return env.from_string(self.chat_template).render(
                **(template_kwargs or {}),
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except TemplateError as e:
            raise ValueError(f"chat template error: {e}") from None


class IncrementalDetokenizer:
    """Cumulative text of a growing id list, holding back an incomplete UTF-8 sequence at the end.

    Byte-level BPE splits multi-byte characters across tokens; decoding such a prefix yields U+FFFD. Streaming
    that and later replacing it would break SGLang's "each chunk extends the previous text" contract, so the
    tail is held back until the character is complete (or the request ends). Like SGLang's detokenizer it
    decodes only a window after the last complete point, so a long stream costs O(n), not O(n^2).
    """

    def __init__(self, tokenizer: ServerTokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._surr = 0  # start of the decode window: tokens before it are in `text`
        self._read = 0  # end of what `text` covers

    def extend(self, new_ids: list[int], final: bool = False) -> str:
        if not new_ids and (not final or self._read == len(self.ids)):
            # Nothing new to decode (a stream asks for the text several times per chunk: the stop-string
            # hold-back check, then the chunk itself): two decodes per call saved.
            return self.text
        self.ids.extend(new_ids)
        decode = self._tokenizer.decode
        prefix = decode(self.ids[self._surr : self._read], self._skip)
        window = decode(self.ids[self._surr :], self._skip)
        new_text = window[len(prefix) :]
        if new_text and (final or not new_text.endswith("\ufffd")):
            self.text += new_text
            self._surr, self._read = self._read, len(self.ids)
        return self.text
