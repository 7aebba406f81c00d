"""A TCP relay a test can cut (every connection closed, new ones refused) and mend: what a client sees when the
server behind it (PostgreSQL, Redis) is stopped, restarted or failed over, for servers the suite cannot stop."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.netutil import pick_free_port


class Relay:
    """A TCP relay to PostgreSQL that can be cut (every connection closed, new ones refused) and mended."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.port = pick_free_port()
        self.listener: socket.socket | None = None
        self.mend()

    def mend(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self.lock:
            listener, self.listener = self.listener, None
            conns, self.conns = self.conns, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
