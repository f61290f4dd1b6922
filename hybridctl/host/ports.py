"""Is a loopback port free, and which one to take when it is not (init --demo, demo)."""

from __future__ import annotations

import socket


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (another process may still take it before the server binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def preferred_or_free_port(preferred: int, host: str = "127.0.0.1") -> int:
    return preferred if port_free(preferred, host) else free_port(host)
