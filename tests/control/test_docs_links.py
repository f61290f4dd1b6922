"""Every relative link in the manual resolves: the file exists and its #anchor is a heading of that file (GitHub's
slugs). Covers docs/, the README and the other Markdown files that link into docs/."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Our pages only: a hidden directory holds what a benchmark set-up unpacked (e.g. llama.cpp's own docs under
# benchmarks/peers/.work), which is not ours to keep linked.
PAGES = sorted(
    p
    for p in [*REPO.glob("docs/*.md"), REPO / "README.md", *REPO.glob("templates/**/README.md"),
              *REPO.glob("benchmarks/**/README.md")]
    if not any(part.startswith(".") for part in p.relative_to(REPO).parts)
)  # fmt: skip
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    out = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(REPO)}: ({target})"
        if not dest.exists():
            out.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{where}: no heading with that anchor in {dest.relative_to(REPO)}")
    return out


def test_slugs_follow_github() -> None:
    assert slug("Values for `init` (`recommend`)") == "values-for-init-recommend"
    assert slug("Live: `doctor --url`") == "live-doctor---url"
    assert slug("Sampling controls, n > 1, cache details") == "sampling-controls-n--1-cache-details"
    assert slug("Prefill/decode disaggregation") == "prefilldecode-disaggregation"


def test_every_relative_link_and_anchor_resolves() -> None:
    assert [p for p in PAGES if p.name != "README.md"], "no docs found"
    assert [problem for page in PAGES for problem in broken_links(page)] == []


REPO_PATH = re.compile(
    r"(?<![\w./~$-])((?:hybridctl|hybridshared|runtime|benchmarks|tests|scripts|templates)/[\w./-]*\w)"
)


def test_every_repository_path_the_manual_names_exists() -> None:
    """A file or directory of ours named in the manual exists (a moved module leaves no stale path behind). Paths
    under a benchmark's git-ignored work directory are what a benchmark writes, not ours to keep."""
    missing = []
    for page in PAGES:
        for path in sorted(set(REPO_PATH.findall(page.read_text(encoding="utf-8")))):
            hidden = any(part.startswith(".") for part in Path(path).parts)  # a git-ignored work directory
            if hidden or (REPO / path).exists() or any((REPO / path).parent.glob(Path(path).name + "*")):
                continue
            missing.append(f"{page.relative_to(REPO)}: {path}")
    assert missing == []
