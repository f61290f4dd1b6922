"""Prefill/decode disaggregation for the bundled runtime (SGLang's `--disaggregation-mode prefill|decode`).

The prefill server computes a prompt and its first token; the decode server fetches the prompt's KV and the
recurrent state of every linear layer from the prefill server's bootstrap port in one atomic transfer
(protocol.py), then continues generation. prefill.py and decode.py wrap the engine client; engine_ops.py is
the part that touches the pools, run on the engine thread.
"""
