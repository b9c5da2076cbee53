"""Every operation of the dispatcher's API this client calls: its method and
path template exactly as the OpenAPI document (``GET /openapi.json``,
committed as ``schemas/openapi.json``) spells them, and whether repeating it
is harmless. Requests are built only from these (``_core.Call``), and
``tests/test_endpoints.py`` checks each against the document, so the client
cannot call a route the document does not have.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True)
class Endpoint:
    """One operation: ``method`` and ``path`` (an OpenAPI path template,
    e.g. ``/v1/runs/{id}``).

    ``idempotent``: a repeat of the same request is harmless, so it is
    retried through an outage (a connection error, a timeout, 502/503/504).
    True for reads, for posts the dispatcher deduplicates (an approval
    decision per call, a tool result per call, a cancel, a message that
    carries ``head_seq``) and for posts that carry an ``Idempotency-Key``
    (runs, batches). A request that is not idempotent is retried only when
    it never reached the dispatcher (the connection could not be made, or
    the dispatcher answered 503 ``not_ready`` before handling it).
    """

    method: str
    path: str
    idempotent: bool

    def url(self, **params: object) -> str:
        """The path with each ``{name}`` replaced by ``params[name]``,
        percent-encoded as one path segment (a call id with a ``/`` stays
        one segment). Raises ``KeyError`` for a missing parameter."""
        path = self.path
        for name, value in params.items():
            token = "{" + name + "}"
            if token not in path:
                raise KeyError(f"{self.path} has no parameter {name!r}")
            path = path.replace(token, quote(str(value), safe=""))
        if "{" in path:
            raise KeyError(f"{self.path}: a path parameter is missing ({path})")
        return path


CREATE_RUN = Endpoint("POST", "/v1/runs", idempotent=True)  # by its Idempotency-Key
LIST_RUNS = Endpoint("GET", "/v1/runs", idempotent=True)
GET_RUN = Endpoint("GET", "/v1/runs/{id}", idempotent=True)
ERASE_RUN = Endpoint("DELETE", "/v1/runs/{id}", idempotent=True)
LIST_EVENTS = Endpoint("GET", "/v1/runs/{id}/events", idempotent=True)
STREAM_EVENTS = Endpoint("GET", "/v1/runs/{id}/events/stream", idempotent=True)

LIST_APPROVALS = Endpoint("GET", "/v1/approvals", idempotent=True)
# Each decision is deduplicated per approval request: a repeat answers 409.
DECIDE_BULK = Endpoint("POST", "/v1/approvals", idempotent=True)
DECIDE = Endpoint("POST", "/v1/runs/{id}/approvals/{call_id}", idempotent=True)

POST_TOOL_RESULT = Endpoint("POST", "/v1/runs/{id}/tool-results/{call_id}", idempotent=True)
POST_MESSAGE = Endpoint("POST", "/v1/runs/{id}/messages", idempotent=True)  # with head_seq
# Not deduplicated: a repeat after the first landed and the run moved on
# (resumed, paused again on its budget) would pause it again or add the
# extension twice.
PAUSE_RUN = Endpoint("POST", "/v1/runs/{id}/pause", idempotent=False)
RESUME_RUN = Endpoint("POST", "/v1/runs/{id}/resume", idempotent=False)
CANCEL_RUN = Endpoint("POST", "/v1/runs/{id}/cancel", idempotent=True)
CLOSE_RUN = Endpoint("POST", "/v1/runs/{id}/close", idempotent=True)  # with head_seq

PUT_AGENT = Endpoint("PUT", "/v1/agents/{name}", idempotent=True)
GET_AGENT = Endpoint("GET", "/v1/agents/{name}", idempotent=True)
LIST_AGENTS = Endpoint("GET", "/v1/agents", idempotent=True)
GET_AGENT_VERSION = Endpoint("GET", "/v1/agents/{name}/versions/{version}", idempotent=True)

CREATE_BATCH = Endpoint("POST", "/v1/batches", idempotent=True)  # by its Idempotency-Key
LIST_BATCHES = Endpoint("GET", "/v1/batches", idempotent=True)
GET_BATCH = Endpoint("GET", "/v1/batches/{id}", idempotent=True)
BATCH_RESULTS = Endpoint("GET", "/v1/batches/{id}/results", idempotent=True)
BATCH_STREAM = Endpoint("GET", "/v1/batches/{id}/stream", idempotent=True)
CANCEL_BATCH = Endpoint("POST", "/v1/batches/{id}/cancel", idempotent=True)
PAUSE_BATCH = Endpoint("POST", "/v1/batches/{id}/pause", idempotent=True)
RESUME_BATCH = Endpoint("POST", "/v1/batches/{id}/resume", idempotent=True)

# A repeat would create a second subscription with another secret.
CREATE_WEBHOOK = Endpoint("POST", "/v1/webhooks", idempotent=False)
LIST_WEBHOOKS = Endpoint("GET", "/v1/webhooks", idempotent=True)
DELETE_WEBHOOK = Endpoint("DELETE", "/v1/webhooks/{id}", idempotent=True)
WEBHOOK_DELIVERIES = Endpoint("GET", "/v1/webhooks/{id}/deliveries", idempotent=True)

ALL: tuple[Endpoint, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Endpoint))
"""Every endpoint above."""
