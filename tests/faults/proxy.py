"""A TCP proxy of the test's own between stopdesk and PostgreSQL, to cut connections the way a
database restart does without restarting the machine's PostgreSQL (other tests use it).

It forwards bytes as they come and can be told to cut every connection (RST, no goodbye), to
refuse new ones for a while, or to cut at an exact point of the wire conversation: when a
client's bytes match a pattern (a statement's text, a COMMIT), either before the server sees
them (`drop`: the statement, or the commit, never happened) or once the server has answered
them (`unanswered`: it happened, and the client never hears so).
"""

from __future__ import annotations

import re
import socket
import struct
import threading
from dataclasses import dataclass


@dataclass
class Trigger:
    after: re.Pattern[bytes] | None  # on one connection, this must have been seen first
    on: re.Pattern[bytes]
    mode: str  # "drop" or "unanswered"
    fired: threading.Event


class _Pair:
    def __init__(self, proxy: TcpProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy, self.client, self.server = proxy, client, server
        self.seen_after = False
        self.cut_on_answer = False

    def start(self) -> None:
        threading.Thread(target=self._pump, args=(self.client, self.server, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.server, self.client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if upstream and self.proxy.check(self, data) == "drop":
                    self.proxy.cut()
                    return
                if not upstream and self.cut_on_answer:
                    self.proxy.cut()
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        for sock in (self.client, self.server):
            try:
                # RST rather than FIN where the kernel can: the other side learns of it as of a
                # crash. shutdown() first: a close() alone does not wake the pump blocked in
                # recv() on it, and the socket would stay open until it did.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self.proxy.forget(self)


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.pairs: set[_Pair] = set()
        self.refusing = False
        self.cuts = 0
        self.trigger: Trigger | None = None
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = _Pair(self, client, server)
            with self.lock:
                self.pairs.add(pair)
            pair.start()

    def arm(self, on: bytes, *, mode: str, after: bytes | None = None) -> threading.Event:
        """Cut every connection the first time a client sends `on` (a regex), on a connection
        that has sent `after` before; returns an event set when it has."""
        fired = threading.Event()
        self.trigger = Trigger(re.compile(after) if after else None, re.compile(on), mode, fired)
        return fired

    def check(self, pair: _Pair, data: bytes) -> str:
        trigger = self.trigger
        if trigger is None or trigger.fired.is_set():
            return ""
        if trigger.after is not None and not pair.seen_after:
            pair.seen_after = bool(trigger.after.search(data))
            return ""
        if not trigger.on.search(data):
            return ""
        with self.lock:
            if trigger.fired.is_set():
                return ""
            trigger.fired.set()
        if trigger.mode == "unanswered":
            pair.cut_on_answer = True
            return ""
        return "drop"

    def cut(self) -> int:
        """Every open connection reset at once, as a database restart does."""
        with self.lock:
            pairs = list(self.pairs)
            self.cuts += 1
        for pair in pairs:
            pair.close()
        return len(pairs)

    def forget(self, pair: _Pair) -> None:
        with self.lock:
            self.pairs.discard(pair)

    def close(self) -> None:
        self.listener.close()
        self.cut()
