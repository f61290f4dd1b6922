"""Command-line entry point. Each command lives in its own module and registers on `app`.

Command modules import heavy libraries (rich tables, httpx, the planner) inside their functions so that
`hybridctl --help` stays fast; none of them may import torch.
"""

from __future__ import annotations

from hybridctl.cli import (  # noqa: F401  (imported for their @app.command registrations)
    bench_cmd,
    demo_cmd,
    doctor_cmd,
    init_cmd,
    launch_cmd,
    plan_cmd,
    schema_cmd,
    validate_cmd,
    verify_cmd,
)
from hybridctl.cli.app import app


def main() -> None:
    app()


__all__ = ["app", "main"]
