"""`python -m runtime`: the bundled runtime behind SGLang 0.5.23's HTTP API (flags: hybridshared/flags)."""

from __future__ import annotations

import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from hybridshared.flags.runtime_parser import parse_args

    args = parse_args(argv)  # bad flags exit 2 here, with one line naming the flag
    logging.basicConfig(
        level=args.log_level.upper(),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
    )
    # The warm-up request goes through httpx; its per-request INFO line would claim traffic nobody sent.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from runtime.server.launch import StartupError, serve, start_context

    try:
        ctx = start_context(args)
    except StartupError as e:
        print(f"python -m runtime: error: {e}", file=sys.stderr)
        return 2
    return serve(ctx)


if __name__ == "__main__":
    sys.exit(main())
