"""A TCP proxy in front of the real Postgres that the fault tests switch between modes:

- ``forward``: bytes pass both ways;
- ``refuse``: every connection is closed and new ones are closed at once (a server that is
  down, as the client sees it);
- ``blackhole``: connections stay open and accept bytes, and nothing is answered (a frozen
  server, a partition behind a load balancer). A connection that saw the black hole stays in
  it after the mode changes back, as a half-open connection does; new ones forward again.
"""

from __future__ import annotations

import select
import socket
import threading
from types import TracebackType

from sqlalchemy.engine import make_url


class FaultProxy:
    def __init__(self, upstream_host: str = "127.0.0.1", upstream_port: int = 5432) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode = "forward"
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []

    def url_for(self, url: str) -> str:
        """``url`` (a Postgres URL) through this proxy."""
        return make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(False)

    def __enter__(self) -> FaultProxy:
        self._spawn(self._accept)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._closed.is_set():
            ready, _, _ = select.select([self._listener], [], [], 0.1)
            if not ready:
                continue
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == "refuse":
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            self._spawn(self._pump, client, server)

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peer = {client: server, server: client}
        held = False  # once black-holed, always black-holed
        try:
            while not self._closed.is_set():
                if self.mode == "refuse":
                    return
                held = held or self.mode == "blackhole"
                ready, _, _ = select.select([client, server], [], [], 0.1)
                for end in ready:
                    data = end.recv(65536)
                    if not data:
                        return
                    if not held:
                        peer[end].sendall(data)
        except OSError:
            return
        finally:
            client.close()
            server.close()
