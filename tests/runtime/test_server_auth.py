"""--api-key as SGLang: Bearer auth on all routes but health, ready and metrics; the key is never shown."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.runtime.conftest import start_runtime_server

KEY = "test-key-5f1c0e7a"


def test_api_key_guards_all_routes_but_health(demo_model_dir: Path) -> None:
    args = ("--api-key", KEY, "--enable-metrics", "--memory-budget-gib", "0.5")
    with start_runtime_server(demo_model_dir, *args) as server, httpx.Client(base_url=server.url) as c:
        good = {"Authorization": f"Bearer {KEY}"}
        body = {"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 2}}
        assert c.post("/generate", json=body).status_code == 401
        assert c.post("/generate", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.post("/generate", json=body, headers={"Authorization": KEY}).status_code == 401
        assert c.post("/generate", json=body, headers=good).status_code == 200
        for path in ("/v1/models", "/model_info", "/server_info", "/flush_cache"):
            assert c.get(path).status_code == 401, path
        assert c.get("/v1/models", headers=good).status_code == 200
        for path in ("/health", "/health_generate", "/ready", "/metrics"):
            assert c.get(path).status_code == 200, path
        info = c.get("/server_info", headers=good)
        assert info.status_code == 200
        assert KEY not in info.text
        assert info.json()["api_key"] == "<redacted>"
    assert KEY not in server.log_text()


def test_the_first_of_two_authorization_headers_counts_as_in_sglang(demo_model_dir: Path) -> None:
    # SGLang 0.5.23 reads `request.headers.get("Authorization")` (sglang/srt/utils/auth.py), and starlette's
    # Headers.get returns the first of repeated headers: a right key followed by a wrong one passes, the
    # reverse does not.
    args = ("--api-key", KEY, "--memory-budget-gib", "0.5")
    with start_runtime_server(demo_model_dir, *args) as server, httpx.Client(base_url=server.url) as c:
        right_first = [("Authorization", f"Bearer {KEY}"), ("Authorization", "Bearer wrong")]
        wrong_first = [("Authorization", "Bearer wrong"), ("Authorization", f"Bearer {KEY}")]
        assert c.get("/v1/models", headers=right_first).status_code == 200
        assert c.get("/v1/models", headers=wrong_first).status_code == 401
