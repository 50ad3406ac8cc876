"""Free loopback TCP ports for throwaway servers (PostgreSQL, the document store)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now.

    The socket is closed before the caller binds, so another process could take
    the port in between; for a throwaway server on a test machine that race is
    accepted (the server then fails to start and says so)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
