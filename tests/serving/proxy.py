"""A loopback TCP proxy skeleton for the serving tests: it listens on a free port of
127.0.0.1 (``address``), accepts connections on a daemon thread and hands each one to the
subclass's ``_serve(client)`` on a thread of its own. Subclasses set their own attributes
before calling ``super().__init__`` (the accept thread starts there)."""

from __future__ import annotations

import socket
import threading


class LoopbackProxy:
    """In front of the server at ``address`` (``http://host:port``): ``upstream`` is that
    ``(host, port)``, ``address`` the proxy's own URL."""

    def __init__(self, address: str):
        host, port = address[len("http://") :].split(":")
        self.upstream = (host, int(port))
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.address = f"http://127.0.0.1:{self.lsock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.lsock.accept()
            except OSError:
                return
            self._accepted(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _accepted(self, client: socket.socket) -> None:
        """Called with each accepted connection before its ``_serve`` thread starts."""

    def _serve(self, client: socket.socket) -> None:
        raise NotImplementedError
