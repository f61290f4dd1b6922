"""What the serving engine makes of each key, as findings `validate` and `doctor` print: keys it would ignore
(IGNORED_BY_ENGINE, a warning: `launch` refuses them without --allow-ignored) and keys it names differently
(ENGINE_NAME, info: `memory.enable_elastic_memory_pool` is SGLang's `--enable-unified-memory`).

From the same mapping table `launch` translates with (hybridctl/launch/mapping.py), so the three cannot disagree.
"""

from __future__ import annotations

from collections.abc import Collection

from hybridctl.config.findings import Finding
from hybridctl.config.schema import HybridConfig
from hybridctl.launch.translate import translate


def _logical(source: str) -> tuple[str, str]:
    file, _, key = source.partition(":")
    return file, key


def engine_findings(
    cfg: HybridConfig, engine: str | None, version: str | None, present: Collection[str] = ()
) -> list[Finding]:
    """Findings about `cfg` as `engine` (sglang | builtin; None: nothing to say) would run it.

    `present`: dotted keys written in the files; only those get an ENGINE_NAME note (defaults need none)."""
    if engine not in ("sglang", "builtin"):
        return []
    from hybridctl.launch.version import target_version

    version = target_version(version) if engine == "sglang" else None
    translation = translate(cfg, engine, version)  # type: ignore[arg-type]
    name = f"SGLang {version}" if engine == "sglang" else "the bundled runtime"
    out = [
        Finding(
            "warning",
            "IGNORED_BY_ENGINE",
            item.file,
            None,
            None,
            item.key,
            f"{item.key} = {item.value!r} would be ignored: {item.reason}; `launch` refuses it unless --allow-ignored.",
            f"remove {item.key} from {item.file} (or set it back to its default), or serve with the other engine",
        )
        for item in translation.ignored
    ]
    for flag, source in translation.sources.items():
        file, key = _logical(source)
        if key not in present or key.startswith("extra_engine_args"):
            continue
        if flag == "--" + key.rsplit(".", 1)[-1].replace("_", "-"):
            continue  # the same name: nothing to tell
        out.append(
            Finding(
                "info",
                "ENGINE_NAME",
                file,
                None,
                None,
                key,
                f"{key} is {flag} to {name}.",
                "",
            )
        )
    return out
