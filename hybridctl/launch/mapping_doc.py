"""Render the mapping table as docs/sglang-mapping.md.

Regenerate with `python -m hybridctl.launch.mapping_doc`; `--check` exits 1 when the file is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hybridctl.config.atomic_write import write_text_atomic
from hybridctl.launch.mapping import ROWS
from hybridctl.launch.mapping_row import Target, default_value
from hybridshared.flags.engine_flags import DEFAULT_SGLANG_VERSION, available_versions, sglang_flags

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "sglang-mapping.md"

_HEADER = """\
# Config keys → engine flags

<!-- Generated from hybridctl/launch/mapping.py by `python -m hybridctl.launch.mapping_doc`;
do not edit by hand (a test checks it is current). -->

Every key of `config.toml` and `settings.json`, and what `hybridctl launch` makes of it for SGLang
(flags as of {version}, older releases where they differ) and for the bundled runtime (`python -m runtime`).

- **built into SGLang**: SGLang always behaves like the default and has no switch; any other value
  would be silently ignored, so `launch` refuses it unless `--allow-ignored`.
- **not supported**: no equivalent in that engine; `launch` refuses a non-default value unless
  `--allow-ignored`.
- **hybridctl only**: read by hybridctl (engine choice, the upstream gateway of `verify upstream`), never an
  engine flag.
- Flags marked (≥ X) exist from release X on; the gates were read from the published sglang wheels.

- **SGLang releases**: the held releases ({first} … {last}, hybridshared/data) whose own parser has the flag,
  read from the per-release flag data (scripts/regen_sglang_flags.py); `validate` refuses a value the
  target release lacks (SGLANG_RELEASE_* findings). Which release each command judges, and every
  release's dry-run check: [sglang-releases.md](sglang-releases.md).

| file | key | default | SGLang | SGLang releases | bundled runtime | notes |
|---|---|---|---|---|---|---|"""

_FOOTER = """
## Version gates

- `--mamba-scheduler-strategy` appeared in 0.5.7 (extra_buffer_lazy among its choices from 0.5.13); 0.5.14
  renamed it `--mamba-radix-cache-strategy`
  (the old name stayed as a deprecated alias through 0.5.19; 0.5.20 and later reject it).
- `--enable-unified-memory` (the elastic pool) exists from 0.5.15.
- Strategy `no_buffer` also gets `--disable-overlap-schedule`: SGLang asserts that no_buffer runs without
  overlap scheduling instead of turning overlap off for an explicit no_buffer.

## Prefill/decode disaggregation

With `[pd] enable_pd_disaggregation = true` one config becomes three processes:

- a prefill server: `--disaggregation-mode prefill --port <prefill_port>
  --disaggregation-bootstrap-port <bootstrap_port>`;
- a decode server: `--disaggregation-mode decode --port <decode_port>` (on one node also
  `--base-gpu-id`, after the prefill server's GPUs);
- the router on `[server] port`: `python -m sglang_router.launch_router --pd-disaggregation
  --prefill URL BOOTSTRAP_PORT --decode URL`.

`hybridctl launch --dry-run` prints all three; `--k8s FILE` writes them as Kubernetes Deployments and
Services.
"""

_STATUS = {
    "built-in": "built into SGLang",
    "not-supported": "not supported",
    "client-side": "hybridctl only",
}


def _cell(target: Target, kind_hint: bool = True) -> str:
    if target.status == "flag" and target.flag:
        how = {"value": " VALUE", "true": " (when true)", "false": " (when false)"}[target.kind]
        text = f"`{target.flag}`{how if kind_hint else ''}"
    elif target.status == "flag":
        text = "passed through"
    else:
        text = _STATUS[target.status]
    gate = []
    if target.since:
        gate.append(f"≥ {target.since}")
    if target.until:
        gate.append(f"< {target.until}")
    return text + (f" ({', '.join(gate)})" if gate else "")


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _releases(targets: tuple[Target, ...]) -> str:
    """The span of held releases whose flag table has each flag of `targets` (gaps shown as separate spans)."""
    held = available_versions()
    cells = []
    for target in targets:
        if target.status != "flag" or not target.flag:
            continue
        has = [v for v in held if target.flag in {o for i in sglang_flags(v).values() for o in (i.name, *i.aliases)}]
        if not has:
            cells.append("none")
            continue
        spans, start, prev = [], has[0], has[0]
        for v in has[1:] + [None]:
            if v is not None and held.index(v) == held.index(prev) + 1:
                prev = v
                continue
            spans.append(start if start == prev else f"{start}–{prev}")
            if v is not None:
                start = prev = v
        cells.append(", ".join(spans))
    return "<br>".join(cells) if cells else "—"


def render_markdown() -> str:
    held = available_versions()
    lines = [*_HEADER.format(version=DEFAULT_SGLANG_VERSION, first=held[0], last=held[-1]).splitlines()]
    for row in ROWS:
        sglang = "<br>".join(_cell(t) for t in row.sglang)
        notes = list(dict.fromkeys(t.note for t in (*row.sglang, row.builtin) if t.note))
        default = default_value(row)
        default_text = "{}" if default == {} else f"`{default!r}`" if default is not None else "unset"
        lines.append(
            f"| {row.file} | `{row.key}` | {_escape(default_text)} | {_escape(sglang)} | {_releases(row.sglang)} | "
            f"{_escape(_cell(row.builtin))} | {_escape('; '.join(notes))} |"
        )
    lines += _FOOTER.splitlines()
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render_markdown()
    if args and args[0] == "--check":
        current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
        return 0 if current == text else 1

    write_text_atomic(DOC_PATH, text)
    print(f"wrote {DOC_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
