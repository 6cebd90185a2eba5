from __future__ import annotations

import socket

import pytest


@pytest.fixture
def unused_tcp_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, read, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
