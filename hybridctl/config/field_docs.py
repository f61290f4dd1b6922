"""Read types, ranges, defaults and docs of schema keys out of the pydantic models.

The single source for everything said about a key: error messages quote `allowed`, init writes
`description` as the TOML comment, docs/configuration.md tabulates all of it.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class FieldDoc:
    path: tuple[str, ...]
    type_text: str  # "integer", "one of: auto, sglang, builtin", "table of string/number/boolean", ...
    allowed: str  # "1 ≤ value ≤ 65535", "" when any value of the type goes
    default: object
    description: str
    optional: bool  # may be unset (None)
    is_section: bool

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    def allowed_text(self) -> str:
        """What an error message quotes: type plus range."""
        text = self.type_text
        if self.allowed:
            text += f" with {self.allowed}"
        if self.optional:
            text += " (or leave the key out: unset)"
        return text


def _strip_optional(annotation: object) -> tuple[object, bool]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) != len(typing.get_args(annotation))
        if len(args) == 1:
            return args[0], optional
        return typing.Union[tuple(args)], optional  # noqa: UP007  (rebuilding a runtime union)
    return annotation, False


_TYPE_NAMES: dict[object, str] = {int: "integer", float: "number", bool: "boolean", str: "string"}


def type_text(annotation: object) -> str:
    annotation, _ = _strip_optional(annotation)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of: " + ", ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        names = [type_text(a) for a in typing.get_args(annotation)]
        return "/".join(dict.fromkeys(names))
    if origin is typing.Annotated:  # a constrained type (pydantic's FiniteFloat): its base, and the constraint
        base, *metadata = typing.get_args(annotation)
        finite = any(getattr(m, "allow_inf_nan", True) is False for m in metadata)
        return ("finite " if finite else "") + type_text(base)
    if origin is dict:
        _, value = typing.get_args(annotation)
        return f"table of {type_text(value)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def bounds_text(info: FieldInfo) -> str:
    low = high = ""
    pattern = ""
    for meta in info.metadata:
        if isinstance(meta, annotated_types.Ge):
            low = f"{meta.ge} ≤ "
        elif isinstance(meta, annotated_types.Gt):
            low = f"{meta.gt} < "
        elif isinstance(meta, annotated_types.Le):
            high = f" ≤ {meta.le}"
        elif isinstance(meta, annotated_types.Lt):
            high = f" < {meta.lt}"
        elif getattr(meta, "pattern", None):
            pattern = f"the pattern {meta.pattern}"
    if low or high:
        return f"{low}value{high}"
    return pattern


def _default_of(info: FieldInfo) -> object:
    if info.default_factory is not None:
        return None
    return info.default


def model_at(model: type[BaseModel], path: Sequence[str]) -> type[BaseModel] | None:
    """The section model found by walking `path` from `model`, or None when `path` leaves the schema."""
    current: type[BaseModel] = model
    for part in path:
        info = current.model_fields.get(part)
        if info is None:
            return None
        annotation, _ = _strip_optional(info.annotation)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        current = annotation
    return current


def field_doc(model: type[BaseModel], path: Sequence[str]) -> FieldDoc | None:
    """Docs of the key at `path` (a section, a field, an entry of a dict field); None: not in the schema."""
    if not path:
        return None
    parent = model_at(model, path[:-1])
    if parent is None:
        # An entry of a dict-valued field such as extra_engine_args.<flag>.
        owner = field_doc(model, path[:-1])
        if owner is None or not owner.type_text.startswith("table of "):
            return None
        return FieldDoc(
            tuple(path), owner.type_text[len("table of ") :], "", None, owner.description, False, False
        )
    info = parent.model_fields.get(path[-1])
    if info is None:
        return None
    annotation, optional = _strip_optional(info.annotation)
    is_section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return FieldDoc(
        path=tuple(path),
        type_text=type_text(info.annotation),
        allowed=bounds_text(info),
        default=_default_of(info),
        description=info.description or "",
        optional=optional,
        is_section=is_section,
    )


def iter_field_docs(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[FieldDoc]:
    """Every key of `model`, sections first then their keys, in declaration order."""
    for name in model.model_fields:
        doc = field_doc(model, (name,))
        assert doc is not None
        doc = replace(doc, path=(*prefix, *doc.path))
        yield doc
        if doc.is_section:
            sub = model_at(model, (name,))
            assert sub is not None
            yield from iter_field_docs(sub, (*prefix, name))


def all_key_names(model: type[BaseModel]) -> dict[str, list[tuple[str, ...]]]:
    """Leaf key name -> every path where it lives: for "did you mean … in another section" hints."""
    names: dict[str, list[tuple[str, ...]]] = {}
    for doc in iter_field_docs(model):
        if not doc.is_section:
            names.setdefault(doc.path[-1], []).append(doc.path)
    return names
