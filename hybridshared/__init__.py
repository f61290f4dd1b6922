"""What the control plane (`hybridctl`) and the bundled runtime (`runtime`) both need, and nothing else of either:
a model's shapes from its config.json, the pool-sizing formula, the engines' flag tables (SGLang's, dumped from
its parser, and the runtime's own `RuntimeArgs`), the C compiler lookup, path lookups that never raise.

Torch-free and imports neither `hybridctl` nor `runtime` (tests/control/test_package_layering.py), so the runtime
sizes its pools and parses its command line with exactly what `plan` and `validate` run, and neither package
imports the other.
"""
