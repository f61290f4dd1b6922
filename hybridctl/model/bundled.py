"""The well-known hybrid checkpoints whose `config.json` ships with hybridctl (templates/models/*.json).

A GPU-less machine writing a config for a GPU server rarely holds the model. When a model path or hub id names
nothing on this host, the commands that read the model's config.json (init, validate, plan, doctor) read the
bundled copy for that checkpoint instead and say so; the path itself is kept as given, for the server that holds
the model. Names are matched as users type them: a hub id (`Qwen/Qwen3-Next-80B-A3B-Instruct`), a path
(`/models/qwen3-next-80b-a3b-thinking-fp8/`, `.../config.json`), a Hugging Face cache directory
(`models--Qwen--Qwen3-Next-80B-A3B-Instruct/snapshots/<hash>`), case-insensitive, with `_`, `.` or `-` between
words, and with release suffixes (-Instruct, -Thinking, -Base, -FP8, -8K, -2507, ...) dropped. A different size
of the same family (Falcon-H1-34B) is a different geometry and does not match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hybridctl.templates import templates_dir
from hybridshared import paths
from hybridshared.model.shape import ModelShape, load_model_shape

# Trailing name parts that change neither layer layout nor cache shapes: tuning, quantization, context variants.
_SUFFIXES = frozenset(
    "instruct thinking base chat it reasoning hf sft dpo rl preview "
    "fp8 fp4 nvfp4 mxfp4 bf16 fp16 fp32 int4 int8 awq gptq bnb dynamic mlx".split()
)
_SUFFIX_PATTERNS = (
    re.compile(r"^\d+k$"),  # context variants: -8K, -128K
    re.compile(r"^\d{4}$"),  # dated refreshes: -2507, -2509
    re.compile(r"^\d+bit$"),  # -4bit
    re.compile(r"^w\d+a\d+$"),  # -W4A16, -W8A8
)
# Leading organisation names some mirrors glue onto the model name (NVIDIA-Nemotron-H-8B, ibm-granite-4.0-h-small).
_ORG_PREFIXES = ("nvidia", "ibm", "moonshotai", "tiiuae")
_SEPARATORS = re.compile(r"[\s._-]+")


@dataclass(frozen=True)
class BundledModel:
    """The bundled config.json standing in for `requested`, which this host does not hold."""

    requested: str  # the path or hub id as given
    name: str  # the bundled checkpoint, e.g. "qwen3-next-80b-a3b"
    config_json: Path  # templates/models/<name>.json

    def note(self) -> str:
        # The file as hybridctl names it, not this host's absolute path: the note is written into config.toml.
        return (
            f"{self.requested} is not on this host: read hybridctl's bundled config.json for {self.name} "
            f"(templates/models/{self.config_json.name}); weights are estimated from it"
        )


def bundled_configs() -> dict[str, Path]:
    """name -> config.json of every bundled checkpoint (the file's stem is the checkpoint's base name)."""
    models = templates_dir() / "models"
    return {p.stem: p for p in sorted(models.glob("*.json"))}


def _checkpoint_name(model: str) -> str:
    """The checkpoint's own name out of a path, hub id or Hugging Face cache path."""
    parts = [p for p in PurePosixPath(model.strip().replace("\\", "/")).parts if p not in ("/", ".")]
    if parts and parts[-1].lower() == "config.json":
        parts = parts[:-1]
    if len(parts) >= 3 and parts[-2] == "snapshots":  # <cache>/models--org--name/snapshots/<revision>
        parts = parts[:-2]
    name = parts[-1] if parts else ""
    if name.startswith("models--"):
        name = name.rsplit("--", 1)[-1]
    return name


def _core_words(name: str) -> list[str]:
    words = [w for w in _SEPARATORS.split(name.lower()) if w]
    while len(words) > 1 and (words[-1] in _SUFFIXES or any(p.match(words[-1]) for p in _SUFFIX_PATTERNS)):
        words.pop()
    while len(words) > 1 and words[0] in _ORG_PREFIXES:
        words.pop(0)
    return words


def match_bundled(model: str) -> BundledModel | None:
    """The bundled checkpoint `model` names (whether or not it exists here), or None."""
    wanted = _core_words(_checkpoint_name(model))
    if not wanted:
        return None
    for name, path in bundled_configs().items():
        if _core_words(name) == wanted:
            return BundledModel(model, name, path)
    return None


def bundled_stand_in(model: str) -> BundledModel | None:
    """The bundled config.json to read for `model` when this host does not hold it; None when it exists here
    (its own config.json is read) or names no bundled checkpoint."""
    if not model.strip() or exists_here(model):
        return None
    return match_bundled(model)


def exists_here(model: str) -> bool:
    """Whether `model` names a file or directory on this host (False for what cannot be a path at all)."""
    return paths.exists(Path(model).expanduser())


def known_names_hint() -> str:
    """Which checkpoints hybridctl knows by name, for the errors about a model this host does not hold."""
    return f"without the files, hybridctl knows these checkpoints by name (hub id or path): {known_names()}"


def known_names() -> str:
    return ", ".join(bundled_configs())


class BundledStandIns:
    """hybridctl's bundled config.json files, standing in for the models this host does not hold."""

    def config_for(self, requested: str) -> Path | None:
        bundled = bundled_stand_in(requested)
        return bundled.config_json if bundled is not None else None

    def hint(self) -> str:
        return known_names_hint()


def load_model_shape_or_bundled(
    path: str | Path, *, tp: int = 1, ssm_dtype: str | None = None, kv_dtype: str = "bfloat16"
) -> ModelShape:
    """`load_model_shape`, reading the bundled config.json for a checkpoint this host does not hold."""
    return load_model_shape(path, tp=tp, ssm_dtype=ssm_dtype, kv_dtype=kv_dtype, stand_ins=BundledStandIns())
