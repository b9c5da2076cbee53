"""Every operation's control flow, written once, without I/O: each is a
generator that yields *steps* (send this request, sleep this long, read the
next frame of that stream, hand this item to the caller) and receives their
outcome. :class:`~glia_client.Client` carries steps out blocking,
:class:`~glia_client.AsyncClient` with ``await`` (``_drive`` in each); the
retry rule, the stream's resume, waiting, and reading batch results live
only here and in ``_core``.

An operation's generator returns its result; items it hands out on the way
(``Emit``) are what an iterator method yields.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar, Union

import httpx

from . import _ops as ops
from . import models
from ._core import (
    TRANSIENT_STATUSES,
    Call,
    EventFollow,
    Outage,
    ResultsRead,
    Settings,
    StreamBroken,
    WaitPlan,
    batch_ended,
    batch_frame,
    describe,
    retry_after,
    to_jsonable,
    transient_why,
)
from .errors import ConflictError, NotFoundError, WaitTimeout

T = TypeVar("T")


@dataclass
class Send:
    """Send ``request`` and read the whole answer. Outcome: the
    ``httpx.Response``, or the ``httpx.TransportError``."""

    request: httpx.Request


@dataclass
class Open:
    """Send ``request`` and open the answer as a stream. Outcome: the open
    ``httpx.Response`` (the driver closes it at :class:`Close` or when the
    operation ends), or the ``httpx.TransportError``."""

    request: httpx.Request


@dataclass
class ReadAll:
    """Read the rest of an open answer and close it. Outcome: the bytes."""

    response: httpx.Response


@dataclass
class NextFrame:
    """The next server-sent event of an open answer. Outcome: an object with
    ``event`` and ``data`` (httpx-sse's ``ServerSentEvent``), ``None`` at the
    end, or the ``httpx.TransportError`` that broke it. With a ``deadline``
    (``time.monotonic()``), the read is cut at that time (the outcome is
    then a transport error): the dispatcher's keep-alives (every 15 s) are
    no frames, so a read timeout alone would never fire."""

    response: httpx.Response
    deadline: float | None = None


@dataclass
class NextLine:
    """The next line of an open answer. Outcome: the ``str``, ``None`` at the
    end, or the ``httpx.TransportError`` that broke it."""

    response: httpx.Response


@dataclass
class Close:
    """Close an open answer. Outcome: ``None``."""

    response: httpx.Response


@dataclass
class Sleep:
    """Wait ``seconds``. Outcome: ``None``."""

    seconds: float


@dataclass
class Emit:
    """Hand ``item`` to the caller (an iterator method yields it). Outcome:
    ``None``."""

    item: Any


Step = Union[Send, Open, ReadAll, NextFrame, NextLine, Close, Sleep, Emit]
Steps = Generator[Step, Any, T]

Http = Union[httpx.Client, httpx.AsyncClient]


def call(http: Http, settings: Settings, c: Call[T]) -> Steps[Any]:
    """``c`` sent and retried through an outage (``_core.Outage``); its
    result (``Call.result``)."""
    outage = Outage(settings, c.endpoint.idempotent)
    request = c.request(http, settings)
    while True:
        outage.attempts += 1
        reply = yield Send(request)
        if isinstance(reply, httpx.TransportError):
            yield Sleep(outage.transport_failed(reply))
            continue
        if reply.status_code in TRANSIENT_STATUSES:
            yield Sleep(outage.transient(reply.status_code, reply.content, retry_after(reply.headers)))
            continue
        return c.result(reply.status_code, reply.content, outage.attempts)


def open_stream(
    http: Http, settings: Settings, c: Call[Any], outage: Outage, timeout: httpx.Timeout
) -> Steps[httpx.Response]:
    """The open 2xx answer of ``c`` (retried through ``outage``). Raises the
    typed error of a refusal."""
    while True:
        outage.attempts += 1
        reply = yield Open(c.request(http, settings, timeout=timeout))
        if isinstance(reply, httpx.TransportError):
            yield Sleep(outage.transport_failed(reply))
            continue
        if reply.status_code in TRANSIENT_STATUSES:
            content = yield ReadAll(reply)
            yield Sleep(outage.failed(transient_why(reply.status_code, content), retry_after(reply.headers)))
            continue
        if not 200 <= reply.status_code < 300:
            content = yield ReadAll(reply)
            raise c.error(reply.status_code, content, outage.attempts)
        return reply


def records(
    response: httpx.Response,
    next_record: Callable[[httpx.Response], Step],
    handle: Callable[[Any], tuple[Any, bool]],
    ended: str | None,
) -> Steps[str | None]:
    """Read an open answer record by record (``NextFrame`` or ``NextLine``):
    ``handle(record)`` gives the item to hand out (or ``None``) and whether
    to stop. Returns ``None`` when done (stopped, or the answer ended and
    ``ended`` is ``None``), else why the stream broke (``ended`` for an end
    that comes too early); the answer is closed either way."""
    while True:
        record = yield next_record(response)
        if isinstance(record, httpx.TransportError):
            why = describe(record)
            break
        if record is None:
            if ended is None:
                yield Close(response)
                return None
            why = ended
            break
        try:
            item, stop = handle(record)
        except StreamBroken as e:
            why = str(e)
            break
        if item is not None:
            yield Emit(item)
        if stop:
            yield Close(response)
            return None
    yield Close(response)
    return why


def first(sub: Steps[Any], accept: Callable[[Any], bool]) -> Steps[Any | None]:
    """Carry out ``sub``'s steps until it hands out an item ``accept``
    takes: that item (``sub`` is closed then), or ``None`` when ``sub``
    ends first."""
    reply: Any = None
    try:
        while True:
            try:
                step = sub.send(reply)
            except StopIteration:
                return None
            reply = None
            if isinstance(step, Emit):
                if accept(step.item):
                    return step.item
                continue
            reply = yield step
    finally:
        sub.close()


def follow(http: Http, settings: Settings, f: EventFollow) -> Steps[None]:
    """A run's events (``Emit``), each once and in order, reconnecting with
    ``Last-Event-ID`` until the run's last event (``_core.EventFollow``)."""

    def handle(frame: Any) -> tuple[Any, bool]:
        return f.on_frame(frame.event, frame.data), f.finished

    while True:
        response = yield from open_stream(http, settings, f.call(), f.outage, f.timeout())
        f.connected(response)
        why = yield from records(
            response,
            lambda r: NextFrame(r, f.deadline),
            handle,
            "the stream ended before the run did",
        )
        if why is None:
            return
        yield Sleep(f.broken(why))


def stream(http: Http, settings: Settings, f: EventFollow) -> Steps[None]:
    """:func:`follow`, except that a run already done whose last event is
    at or before ``f.last`` hands out nothing (the dispatcher's stream would
    wait for an event that never comes)."""
    if f.last > 0:
        run = yield from call(http, settings, ops.get_run(f.run_id))
        if run.status == "done" and run.head_seq <= f.last:
            return
    yield from follow(http, settings, f)


def wait(http: Http, settings: Settings, plan: WaitPlan) -> Steps[models.RunSummary]:
    """The run once ``plan`` is satisfied: read it, then follow its stream
    and read it again after each event that may leave it parked (its park,
    and what a payload records on a parked run without a new park:
    ``session.pause_requested``, ``approval.contested`` …: ``PARK_EVENTS``)
    or ends it, until it is (``_core.WaitPlan``)."""
    get = ops.get_run(plan.run_id)
    run = yield from call(http, settings, get)
    while not plan.satisfied(run):
        f = plan.follow(run, settings)
        sub = follow(http, settings, f)
        reply: Any = None
        arrived = False
        try:
            while True:
                try:
                    step = sub.send(reply)
                except StopIteration:
                    break  # the run's last event: read it below
                reply = None
                if isinstance(step, Emit):
                    if not isinstance(step.item, models.Event):
                        continue
                    if not plan.rereads_after(step.item):
                        if plan.expired():
                            break
                        continue
                    run = yield from call(http, settings, get)
                    if plan.satisfied(run) or plan.expired():
                        arrived = plan.satisfied(run)
                        break
                    continue
                reply = yield step
        except WaitTimeout:
            latest = yield from call(http, settings, get)
            raise plan.timed_out(latest) from None
        finally:
            sub.close()
        if f.response is not None:
            yield Close(f.response)
        if arrived:
            return run
        run = yield from call(http, settings, get)
        if plan.expired() and not plan.satisfied(run):
            raise plan.timed_out(run)
    return run


def batch_progress(http: Http, settings: Settings, batch_id: str) -> Steps[None]:
    """The batch's view (``Emit``) at once and on every change until it
    ends; a broken stream is reopened (it starts with the view then)."""
    f = EventFollow(batch_id, 0, Outage(settings))
    c = ops.batch_stream(batch_id)

    def handle(frame: Any) -> tuple[Any, bool]:
        view = batch_frame(frame.event, frame.data)
        if view is not None:
            f.last += 1  # progress: a healthy stream
        return view, view is not None and batch_ended(view)

    while True:
        response = yield from open_stream(http, settings, c, f.outage, f.timeout())
        f.connected(response)
        why = yield from records(
            response, NextFrame, handle, "the stream ended before the batch did"
        )
        if why is None:
            return
        yield Sleep(f.broken(why))


def wait_batch(
    http: Http, settings: Settings, batch_id: str, deadline: float | None
) -> Steps[models.BatchView]:
    """The batch's view once it ended (or ``WaitTimeout`` past ``deadline``)."""

    def expired() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    while True:
        view = yield from first(
            batch_progress(http, settings, batch_id),
            lambda v: batch_ended(v) or expired(),
        )
        final = yield from call(http, settings, ops.get_batch(batch_id))
        if batch_ended(final):
            return final
        if expired() or (view is not None and not batch_ended(view)):
            raise WaitTimeout(f"batch {batch_id} is still {final.status}", final)


def batch_results(http: Http, settings: Settings, batch_id: str) -> Steps[None]:
    """Every item's result (``Emit``) in submission order; a read that
    breaks is resumed after the results already handed out."""
    outage = Outage(settings)
    read = ResultsRead()
    c = ops.batch_results(batch_id)
    while True:
        response = yield from open_stream(http, settings, c, outage, settings.timeout)
        read.start()
        why = yield from records(response, NextLine, lambda line: (read.on_line(line), False), None)
        if why is None:
            return
        yield Sleep(outage.failed(why, None))


def runs(http: Http, settings: Settings, filters: dict[str, Any]) -> Steps[None]:
    """Every run matching ``filters`` (``Emit``), newest first, following
    the listing's cursors."""
    cursor = filters.pop("cursor", None)
    while True:
        page = yield from call(http, settings, ops.list_runs(cursor=cursor, **filters))
        assert page is not None
        for run in page.runs:
            yield Emit(run)
        if not page.next_cursor:
            return
        cursor = page.next_cursor


def events(http: Http, settings: Settings, run_id: str, after: int) -> Steps[None]:
    """A run's events after ``after`` up to its head (``Emit``), page by page."""
    while True:
        page = yield from call(http, settings, ops.events(run_id, after, 1000))
        assert page is not None
        for event in page.events:
            yield Emit(event)
        if not page.events or page.next_after >= page.head_seq:
            return
        after = page.next_after


# --- payloads: after a retry, did this post land? ---------------------------


def posted(
    http: Http,
    settings: Settings,
    c: Call[models.Accepted],
    codes: frozenset[str],
    landed: Callable[[], Steps[bool]],
) -> Steps[models.Accepted | None]:
    """Send the payload ``c``. When a retry is refused (409, or 404
    ``call_not_found``) with one of ``codes`` (an earlier attempt may have
    landed and lost its answer, or someone else's payload got there first), ``landed()`` reads the run's log for
    this payload's own effect: ``None`` if it is there (done, its answer
    lost), else the refusal is raised."""
    try:
        accepted: models.Accepted | None = yield from call(http, settings, c)
        return accepted
    except (ConflictError, NotFoundError) as e:
        if e.attempts > 1 and e.code in codes:
            mine = yield from landed()
            if mine:
                return None
        raise


def log_until(
    http: Http,
    settings: Settings,
    run_id: str,
    after: int,
    stop: Callable[[models.Event], bool],
) -> Steps[list[models.Event]]:
    """The run's events after ``after`` up to the first that ``stop`` takes
    or the run's last, waiting for them to come (a payload waiting in the
    inbox is applied a moment later), at most ``max_outage`` seconds (at
    least 30); then :class:`WaitTimeout`."""
    deadline = time.monotonic() + max(settings.max_outage, 30.0)
    f = EventFollow(run_id, after, Outage(settings), deadline=deadline)
    seen: list[models.Event] = []

    def take(event: Any) -> bool:
        if not isinstance(event, models.Event):
            return False
        seen.append(event)
        return stop(event)

    yield from first(stream(http, settings, f), take)
    if f.response is not None:
        yield Close(f.response)
    return seen


def terminal(event: models.Event) -> bool:
    """The run's last event."""
    return event.type in ("session.complete", "session.cancel")


def for_call(event: models.Event, types: tuple[str, ...], call_id: str) -> bool:
    """``event`` is one of ``types`` about call ``call_id``."""
    return (
        event.type in types
        and isinstance(event.data, dict)
        and event.data.get("call_id") == call_id
    )


def decision_recorded(
    recorded: Any, decision: str, reason: str | None, input: Any
) -> bool:
    """The ``decision`` of an ``approval.resolved`` event is this one."""
    if not isinstance(recorded, dict) or recorded.get("kind") != decision:
        return False
    if decision == "reject" and reason is not None and reason.strip():
        return bool(recorded.get("reason") == reason.strip())
    if decision == "edit":
        return bool(recorded.get("input") == to_jsonable(input))
    return True


def decide(
    http: Http,
    settings: Settings,
    run_id: str,
    call_id: str,
    decision: str,
    *,
    reason: str | None = None,
    input: Any = None,
    args_hash: str | None = None,
) -> Steps[models.Accepted | None]:
    """Decide an approval. After a retry, 409 ``already_decided`` (or
    ``run_finished``) is success (``None``) only when the call's
    ``approval.resolved`` carries this decision (and for an edit, this
    input; for a reject with a reason, this reason): someone else's decision
    is raised."""
    c = ops.decide(run_id, call_id, decision, reason=reason, input=input, args_hash=args_hash)

    def landed() -> Steps[bool]:
        try:
            events = yield from log_until(
                http, settings, run_id, 0, lambda e: for_call(e, ("approval.resolved",), call_id) or terminal(e)
            )
        except WaitTimeout:
            return False
        return any(
            for_call(e, ("approval.resolved",), call_id)
            and decision_recorded(e.data.get("decision"), decision, reason, input)
            for e in events
        )

    return (yield from posted(http, settings, c, ops.DECISION_LANDED, landed))


def tool_result(
    http: Http, settings: Settings, run_id: str, call_id: str, content: Any, is_error: bool
) -> Steps[models.Accepted | None]:
    """Post an external tool's result. After a retry, 409
    ``already_answered`` (or ``run_finished``) is success (``None``) only
    when the call's recorded result is this content."""
    c = ops.tool_result(run_id, call_id, content, is_error)
    text = c.json["content"]

    def landed() -> Steps[bool]:
        types = ("tool.result", "tool.error")
        try:
            events = yield from log_until(
                http, settings, run_id, 0, lambda e: for_call(e, types, call_id) or terminal(e)
            )
        except WaitTimeout:
            return False
        return any(
            for_call(e, ("tool.result",), call_id) and result_text(e.data.get("content")) == text
            for e in events
        )

    return (yield from posted(http, settings, c, ops.RESULT_LANDED, landed))


def result_text(content: Any) -> str | None:
    """The text of a ``tool.result``'s content (a string, or text blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(str(b.get("text", "")) for b in content)
    return None


def message(
    http: Http,
    settings: Settings,
    run_id: str,
    text: str | None,
    head_seq: int | None,
    close: bool,
) -> Steps[models.Accepted | None]:
    """Post a message (or, with ``close``, a close with ``text``) carrying
    ``head_seq`` (default: the run's head, read first). After a retry, a
    409 ``already_posted``, ``head_moved``, ``not_awaiting_input`` or
    ``run_finished`` is success (``None``: its answer was lost) only when
    the log after ``head_seq`` shows this post applied: a message's
    ``input.received`` carries ``text`` first; a close ended the run
    (``session.complete``) with no model call after ``head_seq``, its
    ``input.received`` (if any) carrying ``text``. Anything else (someone
    else answered) is raised."""
    if head_seq is None:
        run = yield from call(http, settings, ops.get_run(run_id))
        head_seq = run.head_seq
    at = head_seq
    c = ops.close(run_id, text, at) if close else ops.message(run_id, text or "", at)

    def landed() -> Steps[bool]:
        def stop(e: models.Event) -> bool:
            if close:  # a close ends the run; a model call or a park shows it did not
                return terminal(e) or e.type in ("model.call", "model.response", "session.pause")
            return terminal(e) or e.type == "input.received"

        try:
            events = yield from log_until(http, settings, run_id, at, stop)
        except WaitTimeout:
            return False
        received = [e.data.get("text") for e in events if e.type == "input.received"]
        if not close:
            return bool(received) and received[0] == text
        if not events or events[-1].type != "session.complete":
            return False
        if any(e.type in ("model.call", "model.response") for e in events):
            return False
        return received == ([text] if text is not None else [])

    return (yield from posted(http, settings, c, ops.INPUT_LANDED, landed))
