"""An HTTP proxy on loopback that stands for a gateway losing answers: each
request is relayed to the dispatcher unless the test's ``plan`` says
otherwise for it. What the plan can say (:class:`Act`):

- ``FORWARD``: relay the request, stream the answer back (server-sent
  events arrive as they come; the answer ends when the connection closes);
- ``UNSENT``: answer 503 without relaying (a gateway that could not reach
  the dispatcher: nothing happened);
- ``NOT_READY``: answer the dispatcher's own 503 ``not_ready`` without
  relaying (the dispatcher refusing before it handles a request);
- ``LOST``: relay the request, read the dispatcher's whole answer, and
  answer 502 instead (the request took effect; its answer was lost);
- ``FIRST_FRAME``: relay, stream back the answer's first server-sent-event
  frame, then end the answer cleanly (a gateway that closes long answers).

``plan(request)`` is called with each :class:`Request` (its method, path,
and ``n``: how many requests with the same method and path came before)
and returns the act, and optionally a hook to run (in the proxy's thread)
before relaying or answering, or for ``LOST`` once the dispatcher answered
and before the 502: the test uses it to let something else happen at that
moment, e.g. another user's decision, or the run going on to its end.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class Act(Enum):
    """What the proxy does with one request."""

    FORWARD = "forward"
    UNSENT = "unsent"
    NOT_READY = "not_ready"
    LOST = "lost"
    FIRST_FRAME = "first_frame"


@dataclass
class Request:
    """One request the proxy got, and what it did with it."""

    method: str
    path: str
    n: int
    act: Act = Act.FORWARD
    upstream_status: int | None = None
    hook_error: BaseException | None = None


Plan = Callable[[Request], "Act | tuple[Act, Callable[[], None]]"]

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "proxy-connection"}


class LosingProxy:
    """Listens on 127.0.0.1 (``url``) and relays to ``upstream`` (a base
    URL) as ``plan`` says; ``requests`` records every request."""

    def __init__(self, upstream: str, plan: Plan) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.plan = plan
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def handle_one(self) -> None:
                outer._handle(self)

            do_GET = do_POST = do_PUT = do_DELETE = handle_one  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def seen(self, method: str, path_part: str) -> list[Request]:
        """The requests with ``method`` whose path contains ``path_part``."""
        return [r for r in self.requests if r.method == method and path_part in r.path]

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        with self._lock:
            n = sum(1 for r in self.requests if (r.method, r.path) == (h.command, path))
            req = Request(h.command, path, n)
            self.requests.append(req)
        length = int(h.headers.get("content-length", 0) or 0)
        body = h.rfile.read(length) if length else b""
        decided = self.plan(req)
        act, hook = decided if isinstance(decided, tuple) else (decided, None)
        req.act = act

        def run_hook() -> None:
            if hook is not None:
                try:
                    hook()
                except BaseException as e:  # the test reports it
                    req.hook_error = e

        if act is not Act.LOST:
            run_hook()
        h.close_connection = True
        if act is Act.UNSENT:
            self._answer(h, 503, {"error": {"code": "unknown", "message": "gateway: no upstream"}})
            return
        if act is Act.NOT_READY:
            self._answer(h, 503, {"error": {"code": "not_ready", "message": "starting"}})
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=300)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
        conn.request(h.command, h.path, body=body, headers=headers)
        reply = conn.getresponse()
        req.upstream_status = reply.status
        try:
            if act is Act.LOST:
                reply.read()
                run_hook()
                self._answer(h, 502, {"error": {"code": "unknown", "message": "gateway: answer lost"}})
                return
            h.send_response(reply.status)
            for k, v in reply.getheaders():
                if k.lower() not in _HOP:
                    h.send_header(k, v)
            h.send_header("Connection", "close")
            h.end_headers()
            relayed = b""
            while True:
                chunk = reply.read1(65536)
                if not chunk:
                    return
                if act is Act.FIRST_FRAME:
                    relayed += chunk
                    end = relayed.find(b"\n\n")
                    if end >= 0:
                        h.wfile.write(relayed[: end + 2])
                        h.wfile.flush()
                        return  # a clean end: the connection closes
                    continue
                h.wfile.write(chunk)
                h.wfile.flush()
        except OSError:
            pass
        finally:
            conn.close()

    @staticmethod
    def _answer(h: BaseHTTPRequestHandler, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(data)
