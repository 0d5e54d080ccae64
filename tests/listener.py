"""A listener on loopback that records every connection made to it and what was asked, standing
for an address the server was never configured to call (an attacker's, a metadata service, an
internal host). A test fails if anything reaches it."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class Arrival:
    peer: tuple[str, int]
    request: bytes  # the first bytes sent (request line and headers, when it was HTTP)


@dataclass
class Listener:
    """Accepts on 127.0.0.1 (and, when the machine has it, ::1), answers every HTTP request 200
    with an empty JSON object, and keeps each arrival."""

    arrivals: list[Arrival] = field(default_factory=list)
    _sockets: list[socket.socket] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Listener:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        self._sockets.append(sock)
        try:
            six = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            six.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            six.bind(("::1", self.port))
            self._sockets.append(six)
        except OSError:
            pass  # no IPv6 loopback here
        for each in self._sockets:
            each.listen(64)
            each.settimeout(0.1)
            threading.Thread(target=self._serve, args=(each,), daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(1.0)
                try:
                    data = conn.recv(65536)
                except OSError:
                    data = b""
                self.arrivals.append(Arrival(peer=peer[:2], request=data))
                body = b"{}"
                with contextlib.suppress(OSError):
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
                        b"connection: close\r\n\r\n" + body
                    )

    def stop(self) -> None:
        self._stop.set()
        for each in self._sockets:
            each.close()

    def __enter__(self) -> Listener:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
