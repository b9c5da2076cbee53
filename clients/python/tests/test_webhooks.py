"""Webhook verification against a real delivery: the dispatcher delivers
`run.completed` to an HTTP server in the test; the client verifies the
delivery with the subscription's secret, and a tampered body, an old
timestamp or another secret fail."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import ANSWER, WAIT
from standardwebhooks import Webhook

from glia_client import Client, WebhookVerificationError, webhooks


class Receiver:
    """An HTTP server on loopback that records every POST (headers, body)
    and answers 204."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        self.arrived = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with outer.arrived:
                    outer.deliveries.append((dict(self.headers.items()), body))
                    outer.arrived.notify_all()
                self.send_response(204)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/glia-hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def delivery_of(self, run_id: str, timeout: float) -> tuple[dict[str, str], bytes]:
        """The first delivery whose body names ``run_id``."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while True:
                for headers, body in self.deliveries:
                    if run_id.encode() in body:
                        return headers, body
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no delivery for run {run_id} in {timeout} s: {self.deliveries}")
                self.arrived.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_a_real_delivery_verifies_and_a_changed_one_does_not(client: Client, receiver: Receiver) -> None:
    created = client.create_webhook(receiver.url, events=["run.completed"])
    secret = created.secret
    assert secret.startswith("whsec_")
    webhook_id = created.id
    assert created.events == ["run.completed"] and created.format == "standard", created
    try:
        run = client.submit("Answer, and tell the webhook.", config=ANSWER)
        client.wait(run.run_id, until="done", timeout=WAIT)
        headers, body = receiver.delivery_of(str(run.run_id), timeout=WAIT)

        payload = webhooks.verify(secret, body, headers)
        assert payload["type"] == "run.completed"
        assert payload["data"]["run_id"] == str(run.run_id), payload
        # The reference implementation agrees.
        assert Webhook(secret).verify(body, {k.lower(): v for k, v in headers.items()}) == payload

        with pytest.raises(WebhookVerificationError, match="no v1 signature"):
            webhooks.verify(secret, body.replace(b"run.completed", b"run.failed"), headers)
        sent_at = int({k.lower(): v for k, v in headers.items()}["webhook-timestamp"])
        with pytest.raises(WebhookVerificationError, match="old"):
            webhooks.verify(secret, body, headers, now=sent_at + 301)
        other = "whsec_" + base64.b64encode(b"x" * 24).decode()
        with pytest.raises(WebhookVerificationError):
            webhooks.verify(other, body, headers)
        json.loads(body)  # the body is the standard JSON

        ids = [w.id for w in client.list_webhooks().webhooks]
        assert webhook_id in ids
        assert any(d.run_id == run.run_id for d in client.webhook_deliveries(webhook_id).deliveries)
    finally:
        client.delete_webhook(webhook_id)
    assert webhook_id not in [w.id for w in client.list_webhooks().webhooks]
