"""Retries through an outage, against stand-in HTTP servers on loopback
(the CLI's tests do the same, cli/src/client.rs): transient answers are
retried with the same Idempotency-Key, refusals are not, a post that is not
idempotent is never repeated once it may have landed, and past the bound
the error names the server and the last failure."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from glia_client import (
    AsyncClient,
    Client,
    ConflictError,
    ConnectionLostError,
    UnreachableError,
)

RUN = {
    "run_id": str(uuid.uuid4()),
    "tenant": "acme",
    "goal": "g",
    "status": "runnable",
    "phase": "idle",
    "head_seq": 1,
    "created_at": "2026-12-07T10:00:00Z",
    "updated_at": "2026-12-07T10:00:00Z",
    "tags": [],
    "metadata": {},
    "usage": {"turns": 0, "tool_calls": 0, "active_ms": 0, "tokens": {"input_tokens": 0, "output_tokens": 0}, "cost_usd_micros": 0},
    "steps": 0,
    "trace_id": "0" * 32,
}


class StandIn:
    """A loopback HTTP server whose answers ``respond(n, handler)`` picks
    (``n``: the request's index); records each request's headers."""

    def __init__(self, respond: Callable[[int, BaseHTTPRequestHandler], None]) -> None:
        self.requests: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def handle_one(self) -> None:
                n = len(outer.requests)
                outer.requests.append({k.lower(): v for k, v in self.headers.items()})
                length = int(self.headers.get("content-length", 0))
                self.rfile.read(length)
                respond(n, self)

            do_GET = do_POST = handle_one  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def answer(handler: BaseHTTPRequestHandler, status: int, body: object, **headers: str) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for k, v in headers.items():
        handler.send_header(k.replace("_", "-"), v)
    handler.end_headers()
    handler.wfile.write(data)


def flaky(failures: int, status: int) -> Callable[[int, BaseHTTPRequestHandler], None]:
    def respond(n: int, h: BaseHTTPRequestHandler) -> None:
        if n < failures:
            answer(h, status, {"error": {"code": "not_ready", "message": "starting"}}, Retry_After="0")
        else:
            answer(h, 201, RUN)

    return respond


@pytest.fixture
def stand_in() -> Iterator[Callable[..., StandIn]]:
    made: list[StandIn] = []

    def make(respond: Callable[[int, BaseHTTPRequestHandler], None]) -> StandIn:
        s = StandIn(respond)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("status", [502, 503, 504])
def test_transient_answers_are_retried_with_the_same_idempotency_key(stand_in, status: int) -> None:
    server = stand_in(flaky(2, status))
    with Client(server.url, "t", max_outage=30) as glia:
        run = glia.submit("g", config={"model": "script:answer"})
    assert str(run.run_id) == RUN["run_id"]
    keys = [r.get("idempotency-key") for r in server.requests]
    assert len(keys) == 3 and keys[0] and len(set(keys)) == 1, keys
    assert all(r["authorization"] == "Bearer t" for r in server.requests)


def test_a_key_given_is_the_key_sent(stand_in) -> None:
    server = stand_in(flaky(1, 503))
    with Client(server.url, "", max_outage=30) as glia:  # "": no token, whatever $GLIA_TOKEN says
        glia.submit("g", idempotency_key="order-A1-refund")
    assert [r["idempotency-key"] for r in server.requests] == ["order-A1-refund"] * 2
    assert "authorization" not in server.requests[0]


def test_a_refusal_is_not_retried(stand_in) -> None:
    server = stand_in(
        lambda n, h: answer(h, 409, {"error": {"code": "idempotency_conflict", "message": "other body"}})
    )
    with Client(server.url, "t", max_outage=30) as glia, pytest.raises(ConflictError) as err:
        glia.submit("g")
    assert (err.value.status, err.value.code, err.value.attempts) == (409, "idempotency_conflict", 1)
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [502, 504])
def test_a_post_that_is_not_idempotent_is_not_repeated_after_a_gateway_error(stand_in, status: int) -> None:
    server = stand_in(lambda n, h: answer(h, status, {"error": {"code": "upstream", "message": "bad gateway"}}))
    with Client(server.url, "t", max_outage=30) as glia, pytest.raises(ConnectionLostError):
        glia.resume(RUN["run_id"], extend={"max_turns": 5})
    assert len(server.requests) == 1


def test_a_post_that_is_not_idempotent_is_not_repeated_once_sent(stand_in) -> None:
    def respond(n: int, h: BaseHTTPRequestHandler) -> None:
        h.connection.shutdown(socket.SHUT_RDWR)  # the request arrived; its answer is lost

    server = stand_in(respond)
    with Client(server.url, "t", max_outage=30) as glia, pytest.raises(ConnectionLostError):
        glia.create_webhook("https://example.invalid/hook")
    assert len(server.requests) == 1


def test_past_the_bound_the_error_names_the_server_and_the_last_error(stand_in) -> None:
    server = stand_in(flaky(10**9, 503))
    started = time.monotonic()
    with Client(server.url, "t", max_outage=1) as glia, pytest.raises(UnreachableError) as err:
        glia.get_run(RUN["run_id"])
    assert time.monotonic() - started >= 1
    assert err.value.attempts > 1 and err.value.last == "503: starting"
    assert str(err.value).startswith(f"the dispatcher at {server.url} did not answer for ")

    # Nobody listening: the connection error, tried once with a bound of 0.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with Client(closed, "t", max_outage=0) as glia, pytest.raises(UnreachableError) as err:
        glia.get_run(RUN["run_id"])
    assert err.value.attempts == 1 and "onnect" in err.value.last


@pytest.mark.anyio
async def test_the_async_client_retries_alike(stand_in) -> None:
    server = stand_in(flaky(2, 503))
    async with AsyncClient(server.url, "t", max_outage=30) as glia:
        run = await glia.submit("g")
    assert str(run.run_id) == RUN["run_id"]
    keys = [r.get("idempotency-key") for r in server.requests]
    assert len(keys) == 3 and len(set(keys)) == 1
