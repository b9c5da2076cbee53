"""The client's errors.

Every refusal of the dispatcher is an :class:`ApiError` carrying the API's
error body (``{"error": {"code", "message", "field"?, "line"?}}``,
``dispatcher/src/error.rs``): :attr:`ApiError.code` is the stable
snake_case code (``run_not_found``, ``already_decided``, ``invalid_body``
…; codes never change meaning, messages may), :attr:`ApiError.status` the
HTTP status. A subclass per status lets callers catch a family
(``except NotFoundError``) and still read the exact code.

A dispatcher that cannot be reached, or answers 502/503/504, is retried
until the client's ``max_outage`` has passed; then :class:`UnreachableError`.
"""

from __future__ import annotations

import json
from typing import Any


class GliaError(Exception):
    """Base class of every error this package raises."""


class ApiError(GliaError):
    """The dispatcher answered with an error status.

    Attributes:
        status: The HTTP status (e.g. 404).
        code: The API's stable error code (e.g. ``run_not_found``);
            ``unknown`` when the body carried none (a proxy's page).
        message: The API's human-readable message (not stable).
        field: For 422 ``invalid_request`` / ``invalid_body`` and 400
            ``invalid_query``: the offending field, as a path from the body's
            root (``config.budget.max_turns``) or the query parameter's name.
        line: For an error in one line of a JSON Lines upload: its number in
            the upload, from 1, as the dispatcher answered it. A batch
            upload's line 1 is the spec the client writes before the items.
        item: For a batch upload's error in one of the caller's items: its
            position among them, from 1 (``line - 1``); ``None`` when the
            error is not in an item (the spec line, or no line).
        method, path: The request that failed.
        attempts: How many attempts the request took (more than 1 after a
            retry through an outage; see ``Client``).
        body: The answer's body, parsed as JSON when it is JSON, else text.
    """

    def __init__(
        self,
        *,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        line: int | None = None,
        item: int | None = None,
        method: str = "",
        path: str = "",
        attempts: int = 1,
        body: Any = None,
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.line = line
        self.item = item
        self.method = method
        self.path = path
        self.attempts = attempts
        self.body = body
        super().__init__(status, code, message)

    def __str__(self) -> str:
        # Built when shown, so an adjustment after construction (``item``)
        # shows too.
        where = "".join(
            [
                f" (item {self.item})" if self.item is not None else "",
                f" (line {self.line})" if self.line is not None else "",
                f" (field {self.field})" if self.field else "",
            ]
        )
        return f"{self.method} {self.path}: {self.status} {self.code}{where}: {self.message}"


class BadRequestError(ApiError):
    """400: malformed JSON, an invalid query parameter, path or header."""


class AuthenticationError(ApiError):
    """401: no bearer token, or one the dispatcher does not know."""


class PermissionDeniedError(ApiError):
    """403: the token lacks the scope the operation needs."""


class NotFoundError(ApiError):
    """404: no such run, call, approval, agent, batch or webhook, or it
    belongs to another tenant (the same answer, so tenants learn nothing of
    each other); also ``route_not_found``."""


class ConflictError(ApiError):
    """409: the request conflicts with the resource's state
    (``already_decided``, ``run_finished``, ``idempotency_conflict``,
    ``head_moved`` …)."""


class PayloadTooLargeError(ApiError):
    """413: the body is over the dispatcher's limit."""


class UnsupportedMediaTypeError(ApiError):
    """415: the body's content type is not accepted."""


class UnprocessableEntityError(ApiError):
    """422: the body is JSON of the wrong shape (``invalid_body``) or a value
    is refused (``invalid_request``, ``screened_input``); :attr:`field` names
    it."""


class ServerError(ApiError):
    """500 (``internal``, ``corrupt_record``: asking again does not help), or
    a 5xx the client does not retry."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: UnprocessableEntityError,
}


def api_error(
    status: int, content: bytes, *, method: str, path: str, attempts: int = 1
) -> ApiError:
    """The :class:`ApiError` (subclass by status) of an error answer whose
    body is ``content``. A body that is not the API's error JSON (a proxy's
    page) gives code ``unknown`` and its first 500 characters as message."""
    body: Any
    try:
        body = json.loads(content)
    except ValueError:
        body = content.decode("utf-8", "replace")
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict) and isinstance(detail.get("code"), str):
        code = detail["code"]
        message = str(detail.get("message", ""))
        field = detail.get("field") if isinstance(detail.get("field"), str) else None
        line = detail.get("line") if isinstance(detail.get("line"), int) else None
    else:
        code, field, line = "unknown", None, None
        message = (body if isinstance(body, str) else json.dumps(body))[:500]
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    return cls(
        status=status,
        code=code,
        message=message,
        field=field,
        line=line,
        method=method,
        path=path,
        attempts=attempts,
        body=body,
    )


class UnreachableError(GliaError):
    """The dispatcher did not answer (connection errors, timeouts, 502/503/504)
    for longer than the client's ``max_outage``.

    Attributes:
        server: The dispatcher's base URL.
        waited: Seconds from the first failure of the outage to giving up.
        attempts: Attempts made in this outage.
        last: What the last attempt got (a connection error, ``503 …``).
    """

    def __init__(self, *, server: str, waited: float, attempts: int, last: str) -> None:
        self.server = server
        self.waited = waited
        self.attempts = attempts
        self.last = last
        super().__init__(
            f"the dispatcher at {server} did not answer for {waited:.1f} s "
            f"({attempts} attempt(s)); last error: {last}"
        )


class ConnectionLostError(GliaError):
    """A request that is not idempotent (creating a webhook subscription)
    was sent, and the connection failed before its answer came. It is not
    repeated (a repeat would act twice): check whether it took effect."""


class StreamError(GliaError):
    """An event stream sent something this client cannot read (an event that
    is not the documented JSON), so following it further could skip or
    repeat events."""


class WaitTimeout(GliaError, TimeoutError):
    """``wait`` gave up: the run neither parked nor ended within ``timeout``.
    The run goes on; :attr:`run` is its state when the client gave up."""

    def __init__(self, message: str, run: Any) -> None:
        self.run = run
        super().__init__(message)


class WebhookVerificationError(GliaError):
    """A webhook delivery failed Standard Webhooks verification: a header is
    missing or malformed, the timestamp is outside the tolerance, or no
    signature matches. Do not act on its body."""
