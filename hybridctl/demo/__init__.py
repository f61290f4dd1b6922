"""`hybridctl demo`: init --demo, launch the bundled runtime, verify all, a short bench, report.json, stop.

Public API: `run_demo(DemoOptions, progress) -> DemoReport` (raises DemoError with `.report` on a failed step).
"""
