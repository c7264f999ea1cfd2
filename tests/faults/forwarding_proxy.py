"""A loopback TCP proxy in front of crew-server that can lose answers and move streams.

Each connection gets its own thread: the request is read (head and body), sent on to
the current upstream with `Connection: close`, and the answer streamed back as it
comes (an SSE stream included), so every request travels on its own connection.
`drop(prefix)` makes the next request whose request line starts with `prefix` reach
the server, but its answer is read and thrown away: the client sees the connection
close (the lost answer of issue 22). `switch(port)` sends new connections to another
server and cuts the open ones (the Computer's stream moves to the other server);
`drop(prefix, switch_to=port)` does both at once: the retry lands on the other server.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class ForwardingProxy:
    """`url` for a client (a Computer's bootstrap, `crew`'s CREW_SERVER_URL)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.forwarded: list[bytes] = []  # the request lines passed on
        self.dropped: list[bytes] = []  # those whose answer was thrown away
        self._drops: dict[bytes, int] = {}
        self._switch_at_drop: int | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def drop(self, prefix: bytes, times: int = 1, switch_to: int | None = None) -> None:
        """Lose the answers of the next `times` requests starting with `prefix`; with
        `switch_to`, the first loss also moves everything to that server (the retry
        of the lost request goes there)."""
        with self._lock:
            self._drops[prefix] = times
            self._switch_at_drop = switch_to

    def switch(self, upstream_port: int) -> None:
        """New connections go to `upstream_port`; the open ones are cut."""
        with self._lock:
            self.upstream_port = upstream_port
            open_now = list(self._open)
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        self.switch(self.upstream_port)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            self._open.add(client)
            port = self.upstream_port
        try:
            request = _read_request(client)
            if request is None:
                return
            line = request.split(b"\r\n", 1)[0]
            with socket.create_connection(("127.0.0.1", port)) as up:
                with self._lock:
                    self._open.add(up)
                try:
                    up.sendall(request)
                    self.forwarded.append(line)
                    if self._take_drop(line):
                        while up.recv(65536):
                            pass  # the server did the work; its answer is lost
                        self.dropped.append(line)
                        if self._switch_at_drop is not None:
                            port, self._switch_at_drop = self._switch_at_drop, None
                            self.switch(port)
                        return
                    while chunk := up.recv(65536):
                        client.sendall(chunk)
                finally:
                    with self._lock:
                        self._open.discard(up)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(client)
            client.close()

    def _take_drop(self, line: bytes) -> bool:
        with self._lock:
            for prefix, left in self._drops.items():
                if left and line.startswith(prefix):
                    self._drops[prefix] = left - 1
                    return True
        return False


def _read_request(sock: socket.socket) -> bytes | None:
    """One request from `sock` with `Connection: close` in its head; None at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = 0
    kept = [lines[0]]
    for header in lines[1:]:
        name, _, value = header.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        if name.strip().lower() not in (b"connection", b"keep-alive"):
            kept.append(header)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        body += chunk
    return b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n" + body
