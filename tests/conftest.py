"""Settings for the whole suite.

Hypothesis: one profile for every property test, loaded before any test runs. A `@settings(...)` on a test still
overrides the fields it names; the others come from here.

- `deadline=None`: Hypothesis' default 200 ms per example fails a correct test whenever one example lands on a
  stalled moment of a loaded 2-core CI host (and a late example that runs fast on replay is reported as "Unreliable
  test timings", a failure too). What the tests prove is the property, not the speed of one example.
- `HealthCheck.too_slow` suppressed: it fails a test when *generating* its inputs took over a second or so, which
  measures the host's load, not the code.

Examples stay random (no `derandomize`): a failure prints the example and a `@reproduce_failure` blob.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "hybridctl",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("hybridctl")
