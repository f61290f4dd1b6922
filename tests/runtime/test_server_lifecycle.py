"""Start-up order and graceful shutdown of a real `python -m runtime`."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx

from tests.runtime.conftest import start_runtime_server


def test_ready_after_pools_and_sigterm_ends_open_streams_cleanly(demo_model_dir: Path) -> None:
    with start_runtime_server(demo_model_dir, "--memory-budget-gib", "0.5") as server:
        log = server.log_text()
        ready_at = log.index("The server is fired up and ready to roll!")
        assert log.index("Mamba Cache is allocated.") < ready_at
        assert log.index("KV Cache is allocated.") < ready_at
        lines: list[str] = []
        started = threading.Event()

        def stream() -> None:
            body = {
                "input_ids": [1, 2, 3],
                "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True},
                "stream": True,
            }
            with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(60)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0
        reader.join(timeout=30)
    assert lines[-1] == "data: [DONE]"
    assert '"type":"abort"' in lines[-2]
    log = server.log_text()
    assert "Shutting down: aborted 1 unfinished request(s)" in log
    assert "Traceback" not in log
