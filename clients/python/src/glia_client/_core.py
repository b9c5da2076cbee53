"""The shared core of :class:`glia_client.Client` and
:class:`glia_client.AsyncClient`: how each operation's request is built,
how answers become models or typed errors, when and how long to wait
before a retry, and the state of an event stream that resumes across
disconnects. Nothing here does I/O; the two clients only send what this
builds and sleep what this says, each in its own way (blocking or
``await``); ``_steps`` strings these into each operation's control flow.

Retries follow the CLI (``cli/src/client.rs``): a connection error, a
timeout, a body cut off or a 502/503/504 is retried with exponential backoff
(200 ms doubling to 3 s, plus up to as much again of random jitter; at least
the ``Retry-After`` hint) until the dispatcher answers or ``max_outage``
seconds have passed since the outage began; then
:class:`~glia_client.errors.UnreachableError`. Only requests whose repeat is
harmless are retried once they may have reached the dispatcher
(:attr:`Endpoint.idempotent`); any request is retried when the connection
could not even be made.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from . import _endpoints as ep
from . import models
from .errors import (
    ApiError,
    ConnectionLostError,
    StreamError,
    UnreachableError,
    WaitTimeout,
    api_error,
)

DEFAULT_MAX_OUTAGE = 120.0
"""Default ``max_outage``: seconds a client waits out a dispatcher that does
not answer before :class:`UnreachableError`."""

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
"""A request gets 10 s to connect and 60 s for the whole answer."""

STREAM_IDLE = 45.0
"""A stream with nothing (not even the dispatcher's keep-alive, every 15 s)
for this many seconds is taken as broken and resumed."""

HEALTHY_STREAM = 15.0
"""A stream open this many seconds worked: an outage is counted afresh after
it breaks (a stream that breaks sooner without an event counts on)."""

TRANSIENT_STATUSES = frozenset({502, 503, 504})
"""Statuses worth retrying: the dispatcher is restarting or not ready (503),
or a gateway in front of it cannot reach it (502, 504)."""

TERMINAL_EVENTS = frozenset({"session.complete", "session.cancel"})
"""Event types after which a run's stream ends."""

PARK_EVENTS = frozenset(
    {
        "session.pause",
        "session.pause_requested",
        "session.resume",
        "approval.contested",
        "approval.escalated",
    }
)
"""Events after which a run may be parked: its park (``session.pause``),
and what a worker records on a parked run that stays parked (a pause
requested or withdrawn at an approval, a contested or escalated approval).
``wait`` reads the run after these and the run's last event only: mid-step
(after a ``tool.result``, a ``model.call`` …) the run's summary may still
show the park the step is leaving."""

ANSWERABLE_PULL_POINTS = frozenset(
    {"awaiting_approval", "awaiting_tool", "awaiting_input", "awaiting_event", "paused"}
)
"""Pull points a caller answers (a decision, a tool result, a message, an
event, a resume): ``wait`` returns at these by default. A run parked at
another (``awaiting_timer``, ``awaiting_children``, a ``start_at`` not yet
due) goes on by itself, so ``wait`` keeps following it."""

REFUSED_UNSENT = frozenset({"not_ready"})
"""Codes of a 503 the dispatcher answers before it handles the request (it
is starting, or a readiness check failed): nothing was done, so even a
request that is not idempotent may be sent again."""

T = TypeVar("T")
R = TypeVar("R", covariant=True)
M = TypeVar("M", bound=BaseModel)


def new_idempotency_key() -> str:
    """A fresh ``Idempotency-Key``: a random UUID."""
    return str(uuid.uuid4())


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: a pydantic model is dumped with its
    aliases and without the fields that were never set (so the dispatcher
    applies its defaults); mappings and sequences are converted deeply."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def without_none(**fields: Any) -> dict[str, Any]:
    """The given fields that are not ``None``, as JSON data."""
    return {k: to_jsonable(v) for k, v in fields.items() if v is not None}


def model_parser(model: type[M]) -> Callable[[int, bytes], M]:
    """Parse a 2xx answer's JSON body as ``model``."""

    def parse(status: int, content: bytes) -> M:
        return model.model_validate_json(content)

    return parse


@dataclass
class Settings:
    """Where the dispatcher is and how to talk to it.

    Attributes:
        base_url: The dispatcher's base URL (``http://127.0.0.1:8080``).
        token: The bearer token (``GLIA_TOKEN``), if the dispatcher has tokens.
        max_outage: Seconds to keep retrying a dispatcher that does not
            answer; 0 tries once.
        timeout: Per-request timeouts (streams use ``STREAM_IDLE`` for reads).
    """

    base_url: str
    token: str | None
    max_outage: float = DEFAULT_MAX_OUTAGE
    timeout: httpx.Timeout = field(default_factory=lambda: DEFAULT_TIMEOUT)

    @classmethod
    def of(
        cls,
        base_url: str | None,
        token: str | None,
        max_outage: float | None,
        timeout: httpx.Timeout | float | None,
    ) -> Settings:
        """The settings of a client's arguments: ``base_url`` defaults to
        ``$GLIA_URL``, else ``http://127.0.0.1:8080``; ``token`` to
        ``$GLIA_TOKEN`` (``""``: none); ``max_outage`` to
        :data:`DEFAULT_MAX_OUTAGE`; ``timeout`` (seconds, or an
        ``httpx.Timeout``) to :data:`DEFAULT_TIMEOUT`."""
        url = base_url or os.environ.get("GLIA_URL") or "http://127.0.0.1:8080"
        settings = cls(
            base_url=url.rstrip("/"),
            token=token if token is not None else os.environ.get("GLIA_TOKEN"),
        )
        if max_outage is not None:
            settings.max_outage = max_outage
        if timeout is not None:
            settings.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        return settings

    def headers(self) -> dict[str, str]:
        """Headers every request carries."""
        h = {"User-Agent": "glia-client-python/0.1.0"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h


_NO_BODY: Any = object()


@dataclass
class Call(Generic[R]):
    """One request of an operation, as data.

    Attributes:
        endpoint: The operation (method, path template, idempotence).
        params: The path parameters.
        query: Query parameters, in order (a name may repeat).
        json: The JSON body, if any.
        content: A raw body (with its ``Content-Type`` in ``headers``).
        headers: Extra headers (``Idempotency-Key``, ``Last-Event-ID`` …).
        parse: Turns a 2xx answer (status, body) into the result.
        landed: Error codes that, once the request was retried, mean an
            earlier attempt landed and only its answer was lost
            (``already_decided`` for a decision, ``webhook_not_found`` for a
            delete): the call then returns ``None`` instead of raising, as
            the CLI reports it done.
        fix_error: Adjusts an :class:`ApiError` before it is raised.
    """

    endpoint: ep.Endpoint
    params: dict[str, Any] = field(default_factory=dict)
    query: list[tuple[str, str]] = field(default_factory=list)
    json: Any = _NO_BODY
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    parse: Callable[[int, bytes], R] | None = None
    landed: frozenset[str] = frozenset()
    fix_error: Callable[[ApiError], ApiError] | None = None

    @property
    def path(self) -> str:
        """The request's path (parameters filled in, percent-encoded)."""
        return self.endpoint.url(**self.params)

    def request(
        self,
        http: httpx.Client | httpx.AsyncClient,
        settings: Settings,
        *,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Request:
        """The HTTP request (built by ``http``, with its base URL)."""
        headers = settings.headers()
        headers.update(self.headers)
        kwargs: dict[str, Any] = {}
        if self.json is not _NO_BODY:
            kwargs["content"] = json.dumps(self.json, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        elif self.content is not None:
            kwargs["content"] = self.content
        return http.build_request(
            self.endpoint.method,
            self.path,
            params=httpx.QueryParams(tuple(self.query)) if self.query else None,
            headers=headers,
            timeout=timeout or settings.timeout,
            **kwargs,
        )

    def result(self, status: int, content: bytes, attempts: int) -> R | None:
        """The result of a final (not transient) answer: the parsed body of a
        2xx, ``None`` for a ``landed`` code after a retry; else raises the
        :class:`ApiError` of the answer."""
        if 200 <= status < 300:
            if self.parse is None:
                return None
            return self.parse(status, content)
        err = self.error(status, content, attempts)
        if attempts > 1 and err.code in self.landed:
            return None
        raise err

    def error(self, status: int, content: bytes, attempts: int) -> ApiError:
        """The typed error of an error answer."""
        err = api_error(
            status, content, method=self.endpoint.method, path=self.path, attempts=attempts
        )
        return self.fix_error(err) if self.fix_error else err


def retry_after(headers: httpx.Headers) -> float | None:
    """A ``Retry-After`` in seconds form, if any."""
    value = headers.get("retry-after", "").strip()
    return float(value) if value.isdigit() else None


def describe(e: BaseException) -> str:
    """An exception and its causes on one line (httpx's own message may
    omit the cause, e.g. "Connection refused")."""
    parts: list[str] = []
    cur: BaseException | None = e
    while cur is not None:
        text = str(cur) or type(cur).__name__
        if not any(text in p for p in parts):
            parts.append(text)
        cur = cur.__cause__ or cur.__context__
    return ": ".join(parts)


def never_sent(e: httpx.TransportError) -> bool:
    """True when the request cannot have reached the dispatcher (the
    connection was never made), so even a request that is not idempotent
    may be sent again."""
    return isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))


def fatal_transport(e: httpx.TransportError) -> bool:
    """Transport errors that fail the same way every time."""
    return isinstance(e, (httpx.UnsupportedProtocol, httpx.LocalProtocolError))


class Outage:
    """The retries of one request (or one stream) through an outage: counts
    attempts and says how long to wait before the next one, or gives up.

    Args:
        settings: The client's settings (the base URL and ``max_outage``).
        idempotent: Whether a repeat of a request that may have reached the
            dispatcher is harmless.
    """

    def __init__(self, settings: Settings, idempotent: bool = True) -> None:
        self.settings = settings
        self.idempotent = idempotent
        self.since = time.monotonic()
        self.attempts = 0
        self.last = ""

    def restart(self) -> None:
        """Count a new outage from now (the stream worked meanwhile)."""
        self.since = time.monotonic()
        self.attempts = 0

    def transport_failed(self, e: httpx.TransportError) -> float:
        """An attempt failed in transport: the seconds to wait before the
        next. Raises the error's :class:`ConnectionLostError` when the request
        is not idempotent and may have been sent, :class:`UnreachableError`
        past the outage bound."""
        if fatal_transport(e):
            raise e
        if not self.idempotent and not never_sent(e):
            raise ConnectionLostError(
                f"{describe(e)}; the request may have reached the dispatcher and is not "
                "repeated, as a repeat would not be harmless: check whether it took effect"
            ) from e
        return self.failed(describe(e), None)

    def transient(self, status: int, content: bytes, hint: float | None) -> float:
        """An attempt was answered 502/503/504: the seconds to wait before
        the next. A request that is not idempotent is repeated only after a
        503 the dispatcher itself answered without acting
        (:data:`REFUSED_UNSENT`); any other such answer (a gateway's, or the
        dispatcher failing mid-request) may have followed its effect, so it
        raises :class:`ConnectionLostError`."""
        why = transient_why(status, content)
        if not self.idempotent and transient_code(content) not in REFUSED_UNSENT:
            raise ConnectionLostError(
                f"{why}; the request may have reached the dispatcher and is not repeated, "
                "as a repeat would not be harmless: check whether it took effect"
            )
        return self.failed(why, hint)

    def failed(self, why: str, hint: float | None) -> float:
        """An attempt failed transiently (``why``; ``hint``: the answer's
        ``Retry-After``): the seconds to wait before the next, or
        :class:`UnreachableError` when the outage has lasted ``max_outage``."""
        self.last = why
        waited = time.monotonic() - self.since
        if waited >= self.settings.max_outage:
            raise UnreachableError(
                server=self.settings.base_url,
                waited=waited,
                attempts=max(self.attempts, 1),
                last=why,
            )
        step = min(0.2 * 2 ** max(self.attempts - 1, 0), 3.0)
        delay = step + random.uniform(0, step)
        if hint is not None:
            delay = max(delay, hint)
        return min(delay, max(self.settings.max_outage - waited, 0.0) + 0.05)


def transient_code(content: bytes) -> str | None:
    """The API error code of a 502/503/504 answer, if it carries one (a
    gateway's page does not)."""
    try:
        code = json.loads(content)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


def transient_why(status: int, content: bytes) -> str:
    """What a 502/503/504 answer says, for :attr:`UnreachableError.last`."""
    try:
        message = json.loads(content)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = content.decode("utf-8", "replace")[:200]
    return f"{status}: {message}"


# --- the event stream ---------------------------------------------------


class StreamBroken(Exception):
    """The stream ended or broke before the run did (internal)."""


@dataclass
class EventFollow:
    """The state of following one run's event stream
    (``GET /v1/runs/{id}/events/stream``) across reconnects: every persisted
    event is yielded once, in order. Each connection after the first sends
    ``Last-Event-ID`` = the seq of the last event yielded, and an event at or
    below it (a replay) is dropped.

    Attributes:
        run_id: The run.
        last: The seq of the last event yielded (0: none; start after it).
        include_live: Also yield live deltas (``LiveEvent``: model tokens,
            tool progress; best effort, never replayed).
        deadline: ``time.monotonic()`` past which following gives up
            (:class:`WaitTimeout`), if any.
        connections: Connections made so far.
        finished: The run's last event (``session.complete`` or
            ``session.cancel``) was yielded.
        response: The open answer of the current connection, if any.
    """

    run_id: str
    last: int
    outage: Outage
    include_live: bool = False
    deadline: float | None = None
    connections: int = 0
    finished: bool = False
    response: Any = None
    _connected_at: float = 0.0
    _last_at_connect: int = 0

    def call(self) -> Call[None]:
        """The request of the next connection."""
        headers = {"Accept": "text/event-stream"}
        if self.last > 0:
            headers["Last-Event-ID"] = str(self.last)
        return Call(ep.STREAM_EVENTS, {"id": self.run_id}, headers=headers)

    def timeout(self) -> httpx.Timeout:
        """Read timeout of the next connection: ``STREAM_IDLE``, or less when
        the deadline is nearer."""
        read = STREAM_IDLE
        if self.deadline is not None:
            read = max(min(read, self.deadline - time.monotonic()), 0.05)
        return httpx.Timeout(DEFAULT_TIMEOUT.connect, read=read, write=60.0, pool=10.0)

    def connected(self, response: Any = None) -> None:
        """A connection was answered 200 (``response``, open)."""
        self.response = response
        self.connections += 1
        self._connected_at = time.monotonic()
        self._last_at_connect = self.last

    def on_frame(
        self, event: str, data: str
    ) -> models.Event | models.LiveEvent | None:
        """One SSE frame (``event`` name, ``data``): the event to yield, or
        ``None`` (keep-alive, replay, live delta not asked for). Raises
        :class:`StreamBroken` for the dispatcher's ``error`` frame (it could
        not read the log: reconnect), :class:`StreamError` for an event this
        client cannot read."""
        if event == "error":
            raise StreamBroken(f"the dispatcher reported: {data}")
        if event == "live":
            if not self.include_live or not data:
                return None
            try:
                return models.LiveEvent.model_validate_json(data)
            except ValidationError:
                return None  # best effort: a delta of a newer kind is skipped
        if event != "event" or not data:
            return None
        try:
            parsed = models.Event.model_validate_json(data)
        except ValidationError as e:
            raise StreamError(f"run {self.run_id}: the stream sent an unreadable event: {e}") from e
        if parsed.seq <= self.last:
            return None
        self.last = parsed.seq
        if parsed.type in TERMINAL_EVENTS:
            self.finished = True
        return parsed

    def expired(self) -> bool:
        """The deadline has passed."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def broken(self, why: str) -> float:
        """The stream broke (``why``) before the run ended: the seconds to
        wait before reconnecting. Raises :class:`WaitTimeout` past the
        deadline, :class:`UnreachableError` once the stream has been broken
        for ``max_outage`` (a stream that delivered an event or stayed open
        ``HEALTHY_STREAM`` seconds starts the count afresh)."""
        if self.expired():
            raise WaitTimeout(f"run {self.run_id}: gave up waiting at the deadline", None)
        if self.connections and (
            self.last > self._last_at_connect
            or time.monotonic() - self._connected_at >= HEALTHY_STREAM
        ):
            self.outage.restart()
            self._connected_at = float("inf")  # count this break once
        return self.outage.failed(why, None)


# --- waiting for a pull point or the end ----------------------------------


@dataclass
class WaitPlan:
    """What ``wait`` waits for.

    Attributes:
        run_id: The run.
        after: Only a park or an end after this seq counts (the ``head_seq``
            of the run as the caller last saw it, e.g. parked before a
            decision); ``None``: the run's state now counts.
        until: ``"pull_point"`` (parked at one of ``pull_points``, or done)
            or ``"done"``.
        deadline: ``time.monotonic()`` to give up at, if any.
        pull_points: The pull point kinds that end a ``"pull_point"`` wait
            (default :data:`ANSWERABLE_PULL_POINTS`); a done run always does.
    """

    run_id: str
    after: int | None
    until: str
    deadline: float | None
    pull_points: frozenset[str] = ANSWERABLE_PULL_POINTS

    @classmethod
    def of(
        cls,
        run_id: object,
        after: int | None,
        until: str,
        timeout: float | None,
        pull_points: Iterable[str] | None,
    ) -> WaitPlan:
        """The plan of ``wait``'s arguments (``timeout`` in seconds from
        now; ``pull_points`` ``None``: :data:`ANSWERABLE_PULL_POINTS`)."""
        deadline = time.monotonic() + timeout if timeout is not None else None
        kinds = ANSWERABLE_PULL_POINTS if pull_points is None else pull_points
        return cls(str(run_id), after, until, deadline, kinds)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        if self.until not in ("pull_point", "done"):
            raise ValueError(f"until must be 'pull_point' or 'done', not {self.until!r}")
        if isinstance(self.pull_points, str):
            raise ValueError("pull_points is a collection of kinds, not one string")
        self.pull_points = frozenset(self.pull_points)

    def satisfied(self, run: models.RunSummary) -> bool:
        """The run is where the caller waits for it."""
        if run.status == "done":
            return True
        if self.after is not None and run.head_seq <= self.after:
            return False
        if self.until != "pull_point" or run.status != "parked" or run.pull_point is None:
            return False
        return run.pull_point.kind in self.pull_points

    def follow(self, run: models.RunSummary, settings: Settings) -> EventFollow:
        """The stream to follow from ``run`` (its head, or ``after``)."""
        start = max(run.head_seq, self.after or 0)
        return EventFollow(str(self.run_id), start, Outage(settings), deadline=self.deadline)

    def expired(self) -> bool:
        """The deadline has passed."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def rereads_after(self, event: models.Event) -> bool:
        """The run is read again after ``event`` (:data:`PARK_EVENTS` and
        the run's last events)."""
        return event.type in PARK_EVENTS or event.type in TERMINAL_EVENTS

    def timed_out(self, run: models.RunSummary) -> WaitTimeout:
        """The error of a wait that reached its deadline."""
        where = run.pull_point.kind if run.pull_point is not None else run.status
        return WaitTimeout(
            f"run {self.run_id} did not reach "
            f"{'a pull point or its end' if self.until == 'pull_point' else 'its end'} "
            f"in time (now {where}, head {run.head_seq})",
            run,
        )


# --- batches ----------------------------------------------------------------


def batch_upload(
    items: Iterable[Any] | bytes,
    *,
    config: Any = None,
    agent: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> bytes:
    """The JSON Lines body of ``POST /v1/batches``: line 1 the spec
    (``config`` or ``agent``, ``options``), then one item per line (each a
    ``BatchItem`` or a mapping; ``bytes`` are items already as JSON Lines)."""
    spec = without_none(config=config, agent=agent)
    if options:
        spec["options"] = {k: to_jsonable(v) for k, v in options.items() if v is not None}
    lines = [json.dumps(spec, separators=(",", ":")).encode()]
    if isinstance(items, (bytes, bytearray)):
        body = bytes(items)
        if body and not body.endswith(b"\n"):
            body += b"\n"
        return lines[0] + b"\n" + body
    for item in items:
        lines.append(json.dumps(to_jsonable(item), separators=(",", ":")).encode())
    return b"\n".join(lines) + b"\n"


def batch_item(err: ApiError) -> ApiError:
    """A batch upload's error with :attr:`ApiError.item` set: line 1 of the
    upload is the spec the client wrote, so line ``n`` > 1 is the caller's
    item ``n - 1`` (1 = the first); ``line`` stays the upload's line, as the
    dispatcher answered it."""
    if err.line is not None and err.line > 1:
        err.item = err.line - 1
    return err


@dataclass
class ResultsRead:
    """Reading ``GET /v1/batches/{id}/results`` (JSON Lines, in submission
    order) across broken connections: a new read skips the lines already
    yielded."""

    seen: int = 0
    _skip: int = 0

    def start(self) -> None:
        """A new read begins."""
        self._skip = self.seen

    def on_line(self, line: str) -> models.ItemResult | None:
        """One line: the result to yield, or ``None`` (blank, or yielded
        by an earlier read)."""
        if not line.strip():
            return None
        if self._skip > 0:
            self._skip -= 1
            return None
        self.seen += 1
        return models.ItemResult.model_validate_json(line)


def batch_frame(event: str, data: str) -> models.BatchView | None:
    """One frame of ``GET /v1/batches/{id}/stream``: the batch's view, or
    ``None`` (not a ``progress`` frame)."""
    if event != "progress" or not data:
        return None
    return models.BatchView.model_validate_json(data)


BATCH_ENDED = frozenset({"completed", "expired", "cancelled"})
"""Batch statuses after which nothing more happens."""


def batch_ended(view: models.BatchView) -> bool:
    """The batch has ended: ``completed``, ``expired`` or ``cancelled``."""
    return view.status in BATCH_ENDED


# --- agents -------------------------------------------------------------------


@dataclass(frozen=True)
class AppliedAgent:
    """What ``apply_agent`` did.

    Attributes:
        agent: The registered version.
        created: True when the content became a new version (201); False
            when it equals the latest version (200, nothing written).
    """

    agent: models.AgentBody
    created: bool


def applied_agent(status: int, content: bytes) -> AppliedAgent:
    """The answer of ``PUT /v1/agents/{name}``."""
    return AppliedAgent(models.AgentBody.model_validate_json(content), status == 201)


def agent_name(definition: Any) -> str:
    """The ``name`` of an agent definition (a mapping or a model)."""
    data = to_jsonable(definition)
    name = data.get("name") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError("the agent definition has no `name`")
    return name
