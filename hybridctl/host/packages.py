"""torch and sglang builds, read from package metadata and source text — never imported.

Importing torch takes seconds and importing sglang needs a GPU stack; the control plane must do neither.
"""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

from hybridctl.host.facts import SglangFacts, TorchBuild


class PackageMissing(Exception):
    """The package is not installed in this Python; the message names it."""


def torch_build() -> TorchBuild:
    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        raise PackageMissing("torch is not installed in this Python") from None
    version_file = Path(str(dist.locate_file("torch/version.py")))
    cuda = None
    if version_file.is_file():
        cuda = parse_torch_version_file(version_file.read_text(encoding="utf-8")).get("cuda")
    return TorchBuild(version=dist.version, cuda=cuda)


def parse_torch_version_file(text: str) -> dict[str, str | None]:
    """Module-level string/None assignments of torch/version.py (`__version__`, `cuda`, `hip`, ...)."""
    found: dict[str, str | None] = {}
    for node in ast.parse(text).body:
        target = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            if value.value is None or isinstance(value.value, str):
                found[target.id] = value.value
    return found


def sglang_facts() -> SglangFacts:
    try:
        dist = importlib.metadata.distribution("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise PackageMissing("sglang is not installed in this Python") from None
    return read_sglang_source(Path(str(dist.locate_file("sglang"))), dist.version)


def read_sglang_source(package_dir: Path, version: str) -> SglangFacts:
    """Feature gates of an sglang build, read from its own source so they hold for any version or fork.

    Flags are declared as dataclass fields (0.5.2x: srt/arg_groups/fields/*.py) or in srt/server_args.py
    (older releases); a flag exists when its dest name is declared in one of them.
    """
    srt = package_dir / "srt"
    sources = [srt / "server_args.py", *sorted((srt / "arg_groups").rglob("*.py"))]
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in sources if p.is_file())

    def declares(dest: str) -> bool:
        return f"{dest}:" in text or f"--{dest.replace('_', '-')}" in text

    hybrid_cache = (srt / "mem_cache" / "mamba_radix_cache.py").is_file() or (
        srt / "mem_cache" / "unified_cache" / "components" / "mamba.py"
    ).is_file()
    return SglangFacts(
        version=version,
        has_radix_cache_strategy_flag=declares("mamba_radix_cache_strategy"),
        has_scheduler_strategy_flag=declares("mamba_scheduler_strategy"),
        has_hybrid_prefix_cache=hybrid_cache,
        has_unified_memory_flag=declares("enable_unified_memory"),
    )
