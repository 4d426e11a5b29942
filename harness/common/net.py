"""Loopback ports for the engines and load processes the harness starts."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port on loopback that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
