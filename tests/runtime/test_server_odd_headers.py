"""Headers are whatever bytes a client sends: odd ones get a 4xx answer (never a 500 or a dropped connection),
and the server keeps serving. A key no header can carry is refused at start-up."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from hybridshared.flags.runtime_parser import parse_args
from tests.runtime.conftest import start_runtime_server

KEY = "odd-headers-key-3b9d"


def _raw_request(port: int, head: bytes, body: bytes = b"") -> int:
    """Send `head` (request line + headers, CRLF-separated, without the blank line) and return the status."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + b"\r\n\r\n" + body)
        reply = b""
        while b"\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    status_line = reply.split(b"\r\n", 1)[0]
    return int(status_line.split()[1])


def test_odd_bytes_in_headers_get_an_answer_and_the_server_goes_on(demo_model_dir: Path) -> None:
    args = ("--api-key", KEY, "--memory-budget-gib", "0.5")
    with start_runtime_server(demo_model_dir, *args) as server:
        get = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close"
        cases = {
            b"Authorization: Bearer \xff\xfe\x80": 401,  # not UTF-8
            b"Authorization: Bearer " + KEY.encode() + b"\xc3\xa9": 401,  # the key plus one more character
            b"Authorization: \xe2\x80\x8bBearer " + KEY.encode(): 401,  # a zero-width space before the scheme
            b"Authorization: Bearer": 401,  # no key at all
            b"Authorization: Basic " + KEY.encode(): 401,
            b"X-Request-Id: \xff\xfe\x80": 401,  # odd bytes elsewhere, no key
            b"X-Request-Id: a\x00b": 400,  # a NUL is no header value: the HTTP parser answers 400 itself
        }
        for header, status in cases.items():
            assert _raw_request(server.port, get + b"\r\n" + header) == status, header
        good = f"Authorization: Bearer {KEY}".encode()
        assert _raw_request(server.port, get + b"\r\n" + good + b"\r\nX-Odd: \xff\xfe\x80") == 200
        body = b'{"text": "hi", "sampling_params": {"max_new_tokens": 1}}'
        post = b"POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n" + good
        assert _raw_request(server.port, post + b"\r\nContent-Length: \xd9\xa1\xd9\xa2", body) == 400
        length = f"Content-Length: {len(body)}".encode()
        assert _raw_request(server.port, post + b"\r\n" + length + b"\r\nContent-Length: 3", body) == 400
        twice = post + b"\r\n" + length + b"\r\nContent-Type: text/plain\r\nX-Odd: 1\r\nX-Odd: \xff"
        assert _raw_request(server.port, twice, body) == 200  # repeated ordinary headers change nothing
        with httpx.Client(base_url=server.url) as client:
            ok = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}},
                             headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
            assert ok.status_code == 200, ok.text
    assert "Traceback" not in server.log_text()


@pytest.mark.parametrize("key", ["clé", "tab\there", "line\nbreak", "\x00"])
def test_a_key_no_header_can_carry_is_refused_at_start(key: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-path", "/m", "--api-key", key])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--api-key" in err and "printable ASCII" in err and key not in err
