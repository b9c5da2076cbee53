"""glia-client: the Python client of the glia dispatcher's HTTP API.

::

    from glia_client import Client

    with Client("http://127.0.0.1:8080", token="…") as glia:
        run = glia.submit("Refund order A1", config={"model": "claude-sonnet-4-5"})
        run = glia.wait(run.run_id, until="done")
        print(run.outcome.answer)

- :class:`Client` (blocking) and :class:`AsyncClient` (``await``) have the
  same methods; both retry through outages like the ``glia`` CLI.
- :mod:`glia_client.models`: the API's shapes, generated from its OpenAPI
  document (``schemas/openapi.json``).
- :mod:`glia_client.errors`: typed errors carrying the API's error codes.
- :mod:`glia_client.webhooks`: Standard Webhooks verification of deliveries.
"""

from . import errors, models, webhooks
from ._async_client import AsyncClient
from ._client import Client
from ._core import ANSWERABLE_PULL_POINTS, DEFAULT_MAX_OUTAGE, AppliedAgent
from .errors import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    ConnectionLostError,
    GliaError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ServerError,
    StreamError,
    UnprocessableEntityError,
    UnreachableError,
    UnsupportedMediaTypeError,
    WaitTimeout,
    WebhookVerificationError,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Client",
    "AppliedAgent",
    "ANSWERABLE_PULL_POINTS",
    "DEFAULT_MAX_OUTAGE",
    "errors",
    "models",
    "webhooks",
    "ApiError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "ConnectionLostError",
    "GliaError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ServerError",
    "StreamError",
    "UnprocessableEntityError",
    "UnreachableError",
    "UnsupportedMediaTypeError",
    "WaitTimeout",
    "WebhookVerificationError",
]
