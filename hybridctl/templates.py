"""Where hybridctl's bundled templates live: an editable install's repository, or a wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def templates_dir() -> Path:
    """The base templates: the repo's `templates/` in an editable install, else the wheel's `_templates`
    (pyproject force-includes templates/ there)."""
    wheel = _PACKAGE_DIR / "_templates"
    if wheel.is_dir():
        return wheel
    repo = _PACKAGE_DIR.parent / "templates"
    if repo.is_dir():
        return repo
    raise FileNotFoundError(
        f"hybridctl's templates are missing: neither {wheel} nor {repo} exists; reinstall hybridctl "
        "(pip install --force-reinstall hybridctl)."
    )
