"""Whether an address can be served, checked before anything slow runs (``sweeper serve``)."""

from __future__ import annotations

import socket


def address_taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be served (taken, or not an address here), with a free port
    to use instead; None if it is free."""

    def bind(p: int) -> OSError | None:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                s.bind((host, p))
            except OSError as e:
                return e
        return None

    error = bind(port)
    if error is None:
        return None
    free = next((p for p in range(port + 1, min(port + 100, 65536)) if bind(p) is None), None)
    hint = f"; use --port {free}, which is free" if free is not None else ""
    return f"cannot serve on {host}:{port}: {error.strerror or error}{hint}"
