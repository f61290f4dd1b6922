"""`hybridctl bench`: an async load generator for SGLang's HTTP API (and the bundled runtime).

Public API: `run_bench(target, BenchOptions, config) -> BenchResult` (`.to_dict()` is the `--json` shape).
"""
