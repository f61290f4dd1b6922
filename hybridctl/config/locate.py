"""Map a key path ("server.port") to its line and column in the file, so findings point at the right line.

Neither tomlkit nor the json module keeps positions of keys in parsed data, so both files are scanned
here. The scanners run only on text that already parsed, which keeps them small; anything they miss falls
back to the nearest enclosing table (or None), never to a wrong line. Repeated keys are found here too:
tomlkit names a duplicate but not where it is defined the second time, and json keeps only the last value
(`duplicate_toml_key`, `object_paths`).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from typing import Any

Position = tuple[int, int]  # 1-based line and column
KeyPath = tuple[str, ...]

_TABLE_RE = re.compile(r"^\s*\[\[?\s*(?P<name>[^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY_RE = re.compile(
    r"^(?P<indent>\s*)(?P<key>(?:[A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*'))*)\s*="
)
_INLINE_KEY_RE = re.compile(r"[{,]\s*(?P<key>[A-Za-z0-9_\-]+|\"[^\"]*\")\s*=")
_STRING_OR_COMMENT_RE = re.compile(r"\"(?:\\.|[^\"\\])*\"|'[^']*'|#.*")


def _split_dotted(key: str) -> list[str]:
    parts = re.findall(r"\"[^\"]*\"|'[^']*'|[^.\s]+", key)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


class KeyLocator:
    """Positions of keys in one file; `find` answers the exact key or its nearest located ancestor."""

    def __init__(self, positions: dict[KeyPath, Position] | None = None) -> None:
        self.positions: dict[KeyPath, Position] = positions or {}

    def find(self, path: Sequence[str]) -> Position | None:
        key = tuple(str(p) for p in path)
        while key:
            if key in self.positions:
                return self.positions[key]
            key = key[:-1]
        return None

    def exact(self, path: Sequence[str]) -> Position | None:
        return self.positions.get(tuple(str(p) for p in path))

    @classmethod
    def for_toml(cls, text: str) -> KeyLocator:
        return cls(toml_key_positions(text))

    @classmethod
    def for_json(cls, text: str) -> KeyLocator:
        return cls(json_key_positions(text))


def _toml_definitions(text: str) -> Iterator[tuple[str, KeyPath, Position]]:
    """Every table header ("table", "array" for [[name]]) and key ("key"; "inline" inside an inline table) in
    file order, with its full path and position. Lines inside multi-line strings and arrays are skipped."""
    table: list[str] = []
    in_multiline: str | None = None
    open_brackets = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if in_multiline:
            if line.count(in_multiline) % 2 == 1:
                in_multiline = None
            continue
        if open_brackets > 0:
            open_brackets += _bracket_balance(line)
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        table_match = _TABLE_RE.match(line)
        if table_match and stripped.startswith("["):
            table = _split_dotted(table_match.group("name"))
            yield ("array" if stripped.startswith("[[") else "table"), tuple(table), (lineno, line.index("[") + 1)
            continue
        key_match = _KEY_RE.match(line)
        if not key_match:
            continue
        path = (*table, *_split_dotted(key_match.group("key")))
        yield "key", path, (lineno, len(key_match.group("indent")) + 1)
        rest = line[key_match.end() :]
        for quote in ('"""', "'''"):
            if rest.count(quote) % 2 == 1:
                in_multiline = quote
        if in_multiline is None:
            open_brackets = _bracket_balance(rest)
        if rest.lstrip().startswith("{"):
            offset = key_match.end()
            for inner in _INLINE_KEY_RE.finditer(rest):
                inner_key = _split_dotted(inner.group("key"))
                yield "inline", (*path, *inner_key), (lineno, offset + inner.start("key") + 1)


def _bracket_balance(line: str) -> int:
    """Opened minus closed [ ] on a line, outside strings and comments: > 0 while a multi-line array goes on."""
    code = _STRING_OR_COMMENT_RE.sub("", line)
    return code.count("[") - code.count("]")


def toml_key_positions(text: str) -> dict[KeyPath, Position]:
    positions: dict[KeyPath, Position] = {}
    for _kind, path, position in _toml_definitions(text):
        positions.setdefault(path, position)
    return positions


def json_key_positions(text: str) -> dict[KeyPath, Position]:
    """Positions of every object key, tracking the path on a stack; strings are skipped with escapes."""
    line_starts = [0] + [m.end() for m in re.finditer(r"\n", text)]

    def position(offset: int) -> Position:
        line = bisect_right(line_starts, offset)
        return line, offset - line_starts[line - 1] + 1

    positions: dict[KeyPath, Position] = {}
    stack: list[list] = []  # ["obj", current key] or ["arr", index]
    expecting_key = False
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if stack and stack[-1][0] == "obj" and expecting_key:
                try:
                    key = json.loads(text[i : j + 1])
                except ValueError:
                    key = text[i + 1 : j]
                stack[-1][1] = str(key)
                path = tuple(str(frame[1]) for frame in stack)
                positions.setdefault(path, position(i))
                expecting_key = False
            i = j + 1
            continue
        if ch == "{":
            stack.append(["obj", None])
            expecting_key = True
        elif ch == "[":
            stack.append(["arr", 0])
        elif ch in "}]":
            if stack:
                stack.pop()
        elif ch == "," and stack:
            if stack[-1][0] == "obj":
                expecting_key = True
            else:
                stack[-1][1] += 1
        i += 1
    return positions


def toml_duplicates(text: str) -> Iterator[tuple[KeyPath, Position]]:
    """Each key or table that the text defines a second time (TOML allows each once), at the second definition.

    A repeated [[name]] starts a new element of an array of tables: keys and sub-tables repeat legally there. A
    table that only a longer header named ([a] after [a.b]) may still be defined once; one made by dotted keys
    may not be opened again with a header; a value cannot become a table.
    """
    defined: dict[KeyPath, str] = {}  # path -> "table", "array", "key", "super" (made by a longer header), "dotted"
    for kind, path, position in _toml_definitions(text):
        # An inline table's keys sit under a value by design; anything else under a value redefines it.
        parents = [path[:i] for i in range(1, len(path))] if kind != "inline" else []
        values = [parent for parent in parents if defined.get(parent) == "key"]
        if values:
            yield values[0], position
            continue
        previous = defined.get(path)
        if kind == "array" and previous == "array":  # the next element: what the last one defined may repeat
            for other in [p for p in defined if p[: len(path)] == path and len(p) > len(path)]:
                del defined[other]
            continue
        if previous is not None and not (kind == "table" and previous == "super"):
            yield path, position
            continue
        made = "super" if kind in ("table", "array") else "dotted"
        for parent in parents:
            defined.setdefault(parent, made)
        defined[path] = {"table": "table", "array": "array"}.get(kind, "key")


def duplicate_toml_key(text: str, message: str) -> tuple[str, Position | None] | None:
    """For a tomlkit error about a repeated key or table: its dotted path and the second definition's position.

    tomlkit names the key (not its table) and, depending on its version, either no position or the parser's
    position when it noticed (for a table, the end of its body), so the text is scanned here. None when the
    message is about something else; (name, None) when the scan cannot place the key tomlkit names.
    """
    match = re.search(r'Key "(?P<name>[^"]+)" already exists|Redefinition of an existing table', message)
    if match is None:
        return None
    name = match.group("name")
    for path, position in toml_duplicates(text):
        if name is None or path[-1] == name:
            return ".".join(path), position
    return (name, None) if name is not None else None


def object_paths(data: Any, path: tuple[str, ...] = ()) -> dict[int, tuple[str, ...]]:
    """id of every JSON object in `data` -> its key path (to name the section a duplicate key sits in)."""
    out: dict[int, tuple[str, ...]] = {}
    if isinstance(data, dict):
        out[id(data)] = path
        for key, value in data.items():
            out.update(object_paths(value, (*path, str(key))))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            out.update(object_paths(value, (*path, str(index))))
    return out
