"""The runtime's bottom layer: the types every other layer shares and nothing below it to import.

`requests`: requests, sampling parameters, outputs, stats (no torch). `batch`: `ModelLayout`, `PoolBuffers`,
`ForwardBatch`, the contract between the engine and the model code. `buffers`: allocating `PoolBuffers` from a
layout. Layers above (docs/architecture.md): kvcache and models import only core; scheduler imports those; the
engine imports the scheduler; spec, pd and server sit on the engine.
"""
