"""A TCP proxy on loopback that cuts event streams mid-way: for each of its
first ``cuts`` connections it closes both sides once it has relayed
``frames`` complete server-sent-event frames of the answer (and whatever
part of the next frame had arrived with them). It records each
connection's request headers and the ``id:`` of every complete frame it
relayed, so a test can check what the client asked for on reconnecting."""

from __future__ import annotations

import re
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class Connection:
    """What one proxied connection carried."""

    request_headers: dict[str, str] = field(default_factory=dict)
    relayed_ids: list[int] = field(default_factory=list)
    cut: bool = False


class CuttingProxy:
    """Listens on 127.0.0.1 (``url``) and relays to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int], *, cuts: int, frames: int) -> None:
        self.upstream = upstream
        self.cuts = cuts
        self.frames = frames
        self.connections: list[Connection] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                conn = Connection()
                index = len(self.connections)
                self.connections.append(conn)
            threading.Thread(target=self._serve, args=(client, conn, index), daemon=True).start()

    def _serve(self, client: socket.socket, conn: Connection, index: int) -> None:
        server = socket.create_connection(self.upstream)
        # Requests: relay as they come, recording the first request's head.
        threading.Thread(target=self._upstream, args=(client, server, conn), daemon=True).start()
        cut_after = self.frames if index < self.cuts else None
        head = b""
        body = b""
        in_body = False
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                if not in_body:
                    head += data
                    if b"\r\n\r\n" not in head:
                        client.sendall(data)
                        continue
                    in_body = True
                    head, _, data = head.partition(b"\r\n\r\n")
                    client.sendall(head + b"\r\n\r\n")
                relay = data
                if cut_after is not None:
                    start = len(body)
                    body += data
                    frames = [m.end() for m in re.finditer(rb"\n\n", body)]
                    if len(frames) >= cut_after:
                        end = frames[cut_after - 1]
                        # Up to the frame's end and a little of what follows, never all of it.
                        keep = min(len(body), end + 5)
                        if keep == len(body) and len(body) > end:
                            keep = end + (len(body) - end) // 2
                        relay = body[start:keep] if keep > start else b""
                        conn.relayed_ids = [int(i) for i in re.findall(rb"(?m)^id: ?(\d+)", body[:end])]
                        if relay:
                            client.sendall(relay)
                        conn.cut = True
                        return
                client.sendall(relay)
        except OSError:
            pass
        finally:
            for s in (client, server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    @staticmethod
    def _upstream(client: socket.socket, server: socket.socket, conn: Connection) -> None:
        head = b""
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                if not conn.request_headers:
                    head += data
                    if b"\r\n\r\n" in head:
                        lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
                        conn.request_headers = {
                            k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines)
                        }
                server.sendall(data)
        except OSError:
            pass
