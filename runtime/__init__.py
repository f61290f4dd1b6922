"""The bundled runtime: a hybrid-model engine (torch) behind SGLang's HTTP API. Started as `python -m runtime`."""
