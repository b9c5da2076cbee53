"""Verify the dispatcher's webhook deliveries (Standard Webhooks,
https://www.standardwebhooks.com/, as ``dispatcher/src/webhooks.rs`` signs).

A delivery carries three headers:

- ``webhook-id``: the message id, the same on every retry of the delivery
  (deduplicate on it);
- ``webhook-timestamp``: Unix seconds when this attempt was sent;
- ``webhook-signature``: space-separated ``v1,<base64>`` signatures, each
  an HMAC-SHA256 of ``"{id}.{timestamp}.{body}"`` keyed with the base64
  part of the subscription's ``whsec_…`` secret (shown once, when the
  subscription is created).

:func:`verify` checks the headers against the exact body bytes received
(verify before parsing: re-serialised JSON does not match) and refuses a
timestamp more than ``tolerance`` seconds from now (a replayed delivery).
The body is the standard ``{"type", "timestamp", "data"}``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from .errors import WebhookVerificationError

DEFAULT_TOLERANCE = 300
"""Seconds a delivery's timestamp may be from now (the standard's 5 minutes)."""

_PREFIX = "whsec_"


def _key(secret: str | bytes) -> bytes:
    """The HMAC key of a secret: the base64 part of ``whsec_…`` (as text,
    or as bytes read from a file or an environment variable), or raw key
    bytes."""
    if isinstance(secret, (bytes, bytearray)) and bytes(secret).startswith(_PREFIX.encode()):
        try:
            secret = bytes(secret).decode("ascii").strip()
        except UnicodeDecodeError as e:
            raise ValueError("the webhook secret is not `whsec_` and base64") from e
    if isinstance(secret, (bytes, bytearray)):
        key = bytes(secret)
    else:
        try:
            key = base64.b64decode(secret.removeprefix(_PREFIX), validate=True)
        except (binascii.Error, ValueError) as e:
            raise ValueError("the webhook secret is not `whsec_` and base64") from e
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def sign(secret: str | bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value (``v1,<base64>``) of ``body`` sent as
    message ``msg_id`` at ``timestamp`` (Unix seconds) with ``secret``
    (``whsec_…`` as text or bytes, or the raw key bytes). For tests and
    for relaying."""
    mac = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def verify(
    secret: str | bytes,
    body: bytes | str,
    headers: Mapping[str, str],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> Any:
    """Verify one delivery and return its JSON body.

    Args:
        secret: The subscription's ``whsec_…`` secret (text, or the same as
            bytes), or the raw key bytes.
        body: The request body exactly as received (bytes; a ``str`` is
            encoded as UTF-8).
        headers: The request headers (any mapping; names are matched without
            regard to case). A ``webhook-signature`` repeated in the request
            and joined with ``", "`` by the framework is read as its parts.
        tolerance: Seconds the ``webhook-timestamp`` may differ from ``now``
            either way (default 300).
        now: The current Unix time in seconds (default: the clock).

    Raises:
        WebhookVerificationError: a header is missing or malformed, the
            timestamp is outside the tolerance, no ``v1`` signature matches
            (a wrong secret, a changed body or header), or the verified body
            is not JSON.
        ValueError: the secret itself is malformed.
    """
    key = _key(secret)
    raw = body.encode() if isinstance(body, str) else bytes(body)
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get("webhook-id")
    stamp = lower.get("webhook-timestamp")
    signatures = lower.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        missing = [
            n
            for n, v in (
                ("webhook-id", msg_id),
                ("webhook-timestamp", stamp),
                ("webhook-signature", signatures),
            )
            if not v
        ]
        raise WebhookVerificationError(f"missing header(s): {', '.join(missing)}")
    if not (stamp.isascii() and stamp.isdigit()):
        raise WebhookVerificationError(f"webhook-timestamp {stamp[:40]!r} is not Unix seconds")
    timestamp = int(stamp)
    current = time.time() if now is None else now
    if timestamp < current - tolerance:
        raise WebhookVerificationError(
            f"webhook-timestamp is {current - timestamp:.0f} s old (tolerance {tolerance:g} s)"
        )
    if timestamp > current + tolerance:
        raise WebhookVerificationError(
            f"webhook-timestamp is {timestamp - current:.0f} s ahead (tolerance {tolerance:g} s)"
        )
    expected = hmac.new(key, f"{msg_id}.{stamp}.".encode() + raw, hashlib.sha256).digest()
    # Space-separated; a framework joining repeated headers adds ", ".
    for entry in signatures.replace(", ", " ").split():
        version, _, value = entry.partition(",")
        if version != "v1":
            continue
        try:
            given = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        if hmac.compare_digest(expected, given):
            try:
                return json.loads(raw)
            except ValueError as e:
                raise WebhookVerificationError(f"the signed body is not JSON: {e}") from e
    raise WebhookVerificationError("no v1 signature matches the body and headers")
