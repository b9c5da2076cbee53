"""Standard Webhooks verification without a fleet: against the reference
implementation (the `standardwebhooks` package), and what must fail."""

from __future__ import annotations

import base64
import json
import time

import pytest
from standardwebhooks import Webhook

from glia_client import WebhookVerificationError, webhooks

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
BODY = json.dumps({"type": "run.completed", "timestamp": "2026-12-07T10:00:00Z", "data": {"run_id": "r1"}}).encode()


def headers(now: int, signature: str | None = None, msg_id: str = "msg_1") -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(now),
        "webhook-signature": signature or webhooks.sign(SECRET, msg_id, now, BODY),
    }


def test_a_delivery_signed_by_the_reference_verifies() -> None:
    now = int(time.time())
    reference = Webhook(SECRET)
    from datetime import datetime, timezone

    signature = reference.sign("msg_1", datetime.fromtimestamp(now, tz=timezone.utc), BODY.decode())
    assert signature == webhooks.sign(SECRET, "msg_1", now, BODY)
    assert webhooks.verify(SECRET, BODY, headers(now, signature)) == json.loads(BODY)
    # And what this package signs, the reference verifies.
    assert reference.verify(BODY, headers(now)) == json.loads(BODY)


def test_header_names_are_matched_without_case_and_several_signatures_may_come() -> None:
    now = int(time.time())
    h = {k.title(): v for k, v in headers(now).items()}
    h["Webhook-Signature"] = "v1,AAAA v2,xyz " + h["Webhook-Signature"]
    assert webhooks.verify(SECRET, BODY, h)["data"]["run_id"] == "r1"


@pytest.mark.parametrize(
    "change",
    ["body", "id", "timestamp", "secret", "no_v1", "garbage", "missing"],
)
def test_whatever_was_changed_fails(change: str) -> None:
    now = int(time.time())
    h = headers(now)
    body, secret = BODY, SECRET
    if change == "body":
        body = BODY.replace(b"r1", b"r2")
    elif change == "id":
        h["webhook-id"] = "msg_2"
    elif change == "timestamp":
        h["webhook-timestamp"] = str(now - 1)
    elif change == "secret":
        secret = "whsec_" + base64.b64encode(b"another key of 32 bytes, exactly").decode()
    elif change == "no_v1":
        h["webhook-signature"] = h["webhook-signature"].replace("v1,", "v2,")
    elif change == "garbage":
        h["webhook-signature"] = "nonsense"
    elif change == "missing":
        del h["webhook-signature"]
    with pytest.raises(WebhookVerificationError):
        webhooks.verify(secret, body, h)


def test_the_timestamp_must_be_within_the_tolerance() -> None:
    now = int(time.time())
    old = now - 301
    with pytest.raises(WebhookVerificationError, match="old"):
        webhooks.verify(SECRET, BODY, headers(old))
    with pytest.raises(WebhookVerificationError, match="ahead"):
        webhooks.verify(SECRET, BODY, headers(now + 301))
    assert webhooks.verify(SECRET, BODY, headers(old), tolerance=600)
    with pytest.raises(WebhookVerificationError, match="Unix seconds"):
        webhooks.verify(SECRET, BODY, {**headers(now), "webhook-timestamp": "12.5"})


def test_a_malformed_secret_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        webhooks.verify("whsec_***", BODY, headers(int(time.time())))


def test_a_secret_given_as_bytes_of_its_text_verifies() -> None:
    """``whsec_…`` read as bytes (a file, ``os.environb``) is the same secret."""
    now = int(time.time())
    assert webhooks.verify(SECRET.encode(), BODY, headers(now)) == json.loads(BODY)
    assert webhooks.verify(SECRET.encode() + b"\n", BODY, headers(now)) == json.loads(BODY)
    raw = base64.b64decode(SECRET.removeprefix("whsec_"))
    assert webhooks.verify(raw, BODY, headers(now)) == json.loads(BODY), "raw key bytes still work"


def test_signature_headers_joined_by_a_framework_verify() -> None:
    now = int(time.time())
    h = headers(now)
    h["webhook-signature"] = "v1,AAAA, " + h["webhook-signature"]  # two headers, joined
    assert webhooks.verify(SECRET, BODY, h)["data"]["run_id"] == "r1"


def test_an_empty_secret_is_a_value_error() -> None:
    for secret in ("whsec_", "", b""):
        with pytest.raises(ValueError, match="empty"):
            webhooks.verify(secret, BODY, headers(int(time.time())))
