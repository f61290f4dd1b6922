"""The bundled runtime: a hybrid-model engine (torch) behind SGLang's HTTP API. Started as `python -m runtime`."""

import os

# OpenMP workers that spin between parallel regions wreck a shared or oversubscribed CPU: measured on a busy
# 2-core host, a 2048-token prefill on 2 threads took 33 s spinning vs 1.6 s sleeping (1 thread: 1.8 s).
# libgomp reads this once, when torch loads, so it only takes effect when `runtime` is imported first (as in
# `python -m runtime`); an explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
