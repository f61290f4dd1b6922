"""Find literal credentials in config data: secrets belong in environment variables, named by `*_env` keys.

Works on raw parsed data (any nesting of dicts and lists) so it also runs on files that fail the schema.
The secret itself is never echoed: findings show only its kind and length.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

_KEY_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("an OpenAI-style key (sk-...)", re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}")),
    ("a bearer token", re.compile(r"\bBearer\s+[A-Za-z0-9._~+/\-]{8,}=*", re.IGNORECASE)),
    ("a GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{20,}")),
    ("an AWS access key", re.compile(r"\bAKIA[0-9A-Z]{16}\b")),
    ("a Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
]
# Words of key names that hold a credential (whole words: "tokenizer_path" and "max_tokens" are not);
# `*_env` keys hold the NAME of a variable, which is the safe form.
_SECRET_WORDS = {
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "credentials",
    "apikey",
    "auth",
    "bearer",
}
# Query parameters that carry a key by convention (?key=..., ?sig=...), beyond the credential words above.
_URL_KEY_PARAMS = {"key", "sig", "signature", "code", "access_token", "api-key", "x-api-key"}
_KEY_QUALIFIERS = {"api", "access", "secret", "private", "auth"}
_TOKEN_RE = re.compile(r"^[A-Za-z0-9+/=_\-.]{32,}$")


@dataclass(frozen=True)
class SecretHit:
    path: tuple[str, ...]
    kind: str
    length: int


def shannon_entropy(text: str) -> float:
    counts = Counter(text)
    total = len(text)
    return -sum(c / total * math.log2(c / total) for c in counts.values())


def _looks_like_random_token(value: str) -> bool:
    # Long, no spaces or path separators, letters mixed with digits, and close to random: hex digests
    # (4 bits/char at most) and words stay below the threshold, API keys land well above it.
    if not _TOKEN_RE.match(value) or "/" in value:
        return False
    if not (re.search(r"[A-Za-z]", value) and re.search(r"[0-9]", value)):
        return False
    return shannon_entropy(value) > 4.2


def _is_credential_key(key: str) -> bool:
    words = [w for w in re.split(r"[_\-.\s]+", key.lower()) if w]
    if not words or words[-1] == "env":
        return False
    qualified_key = any(w == "key" and i > 0 and words[i - 1] in _KEY_QUALIFIERS for i, w in enumerate(words))
    return qualified_key or bool(_SECRET_WORDS.intersection(words))


def classify_secret(key: str, value: str) -> str | None:
    """What kind of secret `value` (stored under `key`) looks like, or None."""
    for kind, pattern in _KEY_PATTERNS:
        if pattern.search(value):
            return kind
    if "://" in value:
        try:
            parts = urlsplit(value)
            if parts.password or (parts.username and "@" in parts.netloc):
                return "credentials in a URL (user:password@host)"
            for name, value in parse_qsl(parts.query or parts.fragment, keep_blank_values=True):
                if value.strip() and (_is_credential_key(name) or name.lower() in _URL_KEY_PARAMS):
                    return f"a credential in a URL ({name}=...)"
        except ValueError:
            pass
    if _is_credential_key(key) and value.strip():
        return f"a literal value under a credential key ({key})"
    if _looks_like_random_token(value):
        return "a long random-looking token"
    return None


def scan_for_secrets(data: object, path: tuple[str, ...] = ()) -> Iterator[SecretHit]:
    """Every string in `data` (dict keys included in the path) that looks like a credential."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from scan_for_secrets(value, (*path, str(key)))
    elif isinstance(data, list | tuple):
        for index, value in enumerate(data):
            yield from scan_for_secrets(value, (*path, str(index)))
    elif isinstance(data, str):
        key = next((p for p in reversed(path) if not p.isdigit()), "")
        kind = classify_secret(key, data)
        if kind:
            yield SecretHit(path=path, kind=kind, length=len(data))
