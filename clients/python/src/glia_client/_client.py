"""The blocking client, :class:`Client`. Its twin :class:`AsyncClient`
(``_async_client.py``) has the same methods as coroutines. Both build
requests with ``_ops``, run each operation's steps from ``_steps`` and keep
its state in ``_core``; only carrying a step out (``_drive``: send, read,
sleep) differs."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, cast

import httpx
from httpx_sse import EventSource

from . import _ops as ops
from . import _steps, models
from ._core import AppliedAgent, Call, EventFollow, Outage, Settings, WaitPlan
from ._steps import Close, Emit, NextFrame, NextLine, Open, ReadAll, Send, Sleep, Steps

T = TypeVar("T")


class Client:
    """A blocking client of the glia dispatcher's HTTP API.

    Args:
        base_url: The dispatcher's base URL; default ``$GLIA_URL``, else
            ``http://127.0.0.1:8080``.
        token: The bearer token; default ``$GLIA_TOKEN`` (``""``: send none).
        max_outage: Seconds to wait out a dispatcher that cannot be reached or
            answers 502/503/504, retrying with backoff, before
            :class:`~glia_client.errors.UnreachableError` (default 120; 0
            tries once).
        timeout: Per-request timeouts (default: 10 s to connect, 60 s in all).
        http: An ``httpx.Client`` to use (its base URL is replaced); the
            caller closes it.

    Use it as a context manager, or call :meth:`close`. Every error the
    dispatcher answers is an :class:`~glia_client.errors.ApiError` carrying
    its code; see ``glia_client.errors``.
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        max_outage: float | None = None,
        timeout: httpx.Timeout | float | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self._settings = Settings.of(base_url, token, max_outage, timeout)
        self._own = http is None
        self._http = http or httpx.Client()
        self._http.base_url = httpx.URL(self._settings.base_url)

    # --- plumbing ---------------------------------------------------------

    def close(self) -> None:
        """Close the connections (not those of an ``http`` client passed in)."""
        if self._own:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _drive(self, steps: Steps[T]) -> Iterator[tuple[bool, Any]]:
        """Carry out ``steps`` (``_steps``): yields ``(False, item)`` for
        each item handed out, then ``(True, result)``. Every answer opened
        is closed when the operation ends, however it ends."""
        opened: dict[int, httpx.Response] = {}
        frames: dict[int, Iterator[Any]] = {}
        lines: dict[int, Iterator[str]] = {}
        reply: Any = None
        try:
            while True:
                try:
                    step = steps.send(reply)
                except StopIteration as done:
                    yield True, done.value
                    return
                reply = None
                if isinstance(step, Send):
                    try:
                        reply = self._http.send(step.request)
                    except httpx.TransportError as e:
                        reply = e
                elif isinstance(step, Sleep):
                    time.sleep(step.seconds)
                elif isinstance(step, Open):
                    try:
                        reply = self._http.send(step.request, stream=True)
                        opened[id(reply)] = reply
                    except httpx.TransportError as e:
                        reply = e
                elif isinstance(step, ReadAll):
                    try:
                        reply = step.response.read()
                    except httpx.TransportError:
                        reply = b""
                    step.response.close()
                elif isinstance(step, NextFrame):
                    it = frames.setdefault(
                        id(step.response), EventSource(step.response).iter_sse()
                    )
                    cut = _cut_at(step.response, step.deadline)
                    try:
                        reply = next(it, None)
                    except httpx.TransportError as e:
                        reply = e
                    finally:
                        if cut is not None:
                            cut.cancel()
                elif isinstance(step, NextLine):
                    it = lines.setdefault(id(step.response), step.response.iter_lines())
                    try:
                        reply = next(it, None)
                    except httpx.TransportError as e:
                        reply = e
                elif isinstance(step, Close):
                    step.response.close()
                    for table in (opened, frames, lines):
                        table.pop(id(step.response), None)
                elif isinstance(step, Emit):
                    yield False, step.item
        finally:
            steps.close()
            for response in opened.values():
                response.close()

    def _run(self, steps: Steps[T]) -> T:
        """The result of an operation that hands out no items."""
        for done, value in self._drive(steps):
            if done:
                return value  # type: ignore[no-any-return]
        raise AssertionError("an operation ended without a result")

    def _iterate(self, steps: Steps[Any]) -> Iterator[Any]:
        """The items an operation hands out."""
        for done, value in self._drive(steps):
            if done:
                return
            yield value

    def _call(self, call: Call[T]) -> T:
        """Send ``call``, retried through an outage; its result (``None``
        only where the operation documents it)."""
        return cast(T, self._run(_steps.call(self._http, self._settings, call)))



    # --- runs ---------------------------------------------------------------

    def submit(
        self,
        goal: str,
        *,
        config: Mapping[str, Any] | models.RunConfig | None = None,
        agent: str | None = None,
        batch_id: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, str] | None = None,
        start_at: datetime | str | None = None,
        idempotency_key: str | None = None,
    ) -> models.RunSummary:
        """Admit a run (``POST /v1/runs``) and return it as admitted.

        Args:
            goal: The goal, the run's first user message (not blank).
            config: Its configuration (a ``RunConfig`` or the same as a
                mapping); not with ``agent``.
            agent: A registered agent, ``name`` or ``name@VERSION``.
            batch_id: A batch of the tenant's to add the run to.
            tags, metadata: Labels and string pairs to find it by.
            start_at: Start later (an aware datetime or RFC 3339 text).
            idempotency_key: The ``Idempotency-Key`` (1 to 255 visible ASCII
                characters). Default: a fresh one, reused by every retry of
                this call. Submitting the same key again answers the run it
                created (a different goal or config: 409
                ``idempotency_conflict``).

        Raises:
            UnprocessableEntityError: a refused value; ``field`` names it.
            ApiError: any other refusal; UnreachableError.
        """
        return self._call(
            ops.submit(
                goal,
                config=config,
                agent=agent,
                batch_id=batch_id,
                tags=tags,
                metadata=metadata,
                start_at=start_at,
                idempotency_key=idempotency_key,
            )
        )

    def get_run(self, run_id: str) -> models.RunSummary:
        """One run (``GET /v1/runs/{id}``); another tenant's is 404
        ``run_not_found``."""
        return self._call(ops.get_run(str(run_id)))

    def list_runs(self, **filters: Any) -> models.RunPage:
        """One page of runs, newest first (``GET /v1/runs``). Filters
        (``docs/runs.md``): ``status``, ``outcome``, ``agent``, ``version``,
        ``batch_id``, ``tags`` (all must match), ``metadata`` (pairs, all
        must match), ``since``, ``until``, ``error``, ``tenant`` (admins),
        ``parent``, ``limit`` (1 to 1,000), ``cursor`` (a page's
        ``next_cursor``)."""
        return self._call(ops.list_runs(**filters))

    def iter_runs(self, **filters: Any) -> Iterator[models.RunSummary]:
        """Every run matching ``filters`` (as :meth:`list_runs`), newest
        first, following the cursors."""
        return self._iterate(_steps.runs(self._http, self._settings, dict(filters)))

    def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> models.EventPage:
        """One page of a run's events with ``seq > after`` (``GET
        /v1/runs/{id}/events``)."""
        return self._call(ops.events(str(run_id), after, limit))

    def iter_events(self, run_id: str, *, after: int = 0) -> Iterator[models.Event]:
        """A run's events after ``after`` up to its head now, page by page."""
        return self._iterate(_steps.events(self._http, self._settings, str(run_id), after))

    def stream(
        self, run_id: str, *, after: int = 0, include_live: bool = False
    ) -> Iterator[models.Event | models.LiveEvent]:
        """Follow a run's events live (``GET /v1/runs/{id}/events/stream``,
        server-sent events) from ``seq > after`` until its last event
        (``session.complete`` or ``session.cancel``).

        Every persisted event is yielded exactly once and in order: when the
        connection breaks (the dispatcher restarts, a proxy cuts it, nothing
        arrives for 45 s) the client reconnects with ``Last-Event-ID`` = the
        last seq yielded, and drops any event at or below it. It gives up
        with :class:`~glia_client.errors.UnreachableError` once the stream
        has been broken for ``max_outage`` seconds. A run already done
        whose last event is at or before ``after`` yields nothing.

        Args:
            include_live: Also yield ``LiveEvent`` deltas (model tokens, tool
                progress): best effort, never replayed after a reconnect.
        """
        follow = EventFollow(
            str(run_id), after, Outage(self._settings), include_live=include_live
        )
        return self._iterate(_steps.stream(self._http, self._settings, follow))



    def wait(
        self,
        run_id: str,
        *,
        after: int | None = None,
        until: str = "pull_point",
        timeout: float | None = None,
        pull_points: Iterable[str] | None = None,
    ) -> models.RunSummary:
        """Wait until the run parks at a pull point a caller answers or ends
        (``until="pull_point"``), or until it ends (``until="done"``), and
        return it then. Follows the event stream (no polling) and reads the
        run after each event that may leave it parked (``PARK_EVENTS``: its
        park, a pause requested at an approval …) or ends it.

        Args:
            after: Only a park or end after this seq counts: pass the
                ``head_seq`` of the run as you last saw it parked, after you
                answered it (a decision is applied by a worker a moment
                later; until then the run still shows the old park).
                ``None``: a run parked or done now is returned at once.
            timeout: Seconds to wait at most; then
                :class:`~glia_client.errors.WaitTimeout` (the run goes on).
            pull_points: The pull point kinds to return at (default
                ``ANSWERABLE_PULL_POINTS``: ``awaiting_approval``,
                ``awaiting_tool``, ``awaiting_input``, ``awaiting_event``,
                ``paused``); a run parked elsewhere (``awaiting_timer``,
                ``awaiting_children``, a ``start_at`` not yet due) goes on
                by itself and is followed further.
        """
        plan = WaitPlan.of(run_id, after, until, timeout, pull_points)
        return self._run(_steps.wait(self._http, self._settings, plan))

    def cancel(self, run_id: str, *, reason: str | None = None) -> models.Accepted | None:
        """Cancel a run (``POST /v1/runs/{id}/cancel``); a finished run is 409
        ``run_finished``, except after a retry, where the run is finished as
        asked and ``None`` is returned."""
        return self._call(ops.cancel(str(run_id), reason))

    def pause(self, run_id: str, *, reason: str | None = None) -> models.Accepted:
        """Pause a run at its next step boundary (``POST /v1/runs/{id}/pause``).
        Not repeated once it may have reached the dispatcher (a repeat could
        pause a run resumed meanwhile): a lost answer raises
        :class:`~glia_client.errors.ConnectionLostError`."""
        return self._call(ops.pause(str(run_id), reason))

    def resume(
        self, run_id: str, *, extend: Mapping[str, Any] | models.BudgetLimits | None = None
    ) -> models.Accepted:
        """Resume a paused run, optionally adding ``extend`` to its budget
        limits (``POST /v1/runs/{id}/resume``). Not repeated once it may have
        reached the dispatcher (a repeat after the run paused again would add
        ``extend`` twice): a lost answer raises
        :class:`~glia_client.errors.ConnectionLostError`."""
        return self._call(ops.resume(str(run_id), extend))

    def erase(self, run_id: str) -> models.RunSummary:
        """Erase a finished run's content (``DELETE /v1/runs/{id}``, scope
        ``erase``; repeating it is harmless)."""
        return self._call(ops.erase_run(str(run_id)))

    # --- payloads -------------------------------------------------------------

    def post_tool_result(
        self, run_id: str, call_id: str, content: Any, *, is_error: bool = False
    ) -> models.Accepted | None:
        """Post the result of an external tool call (``POST
        /v1/runs/{id}/tool-results/{call_id}``); ``content`` that is not a
        string is sent as JSON text. Returns ``None`` when a retry was
        refused (409 ``already_answered`` or ``run_finished``) and the call's
        recorded result is this content (an earlier attempt landed); another
        result is raised."""
        return self._run(
            _steps.tool_result(self._http, self._settings, str(run_id), call_id, content, is_error)
        )

    def send_message(
        self, run_id: str, text: str, *, head_seq: int | None = None
    ) -> models.Accepted | None:
        """Post the user's next message to a run parked at
        ``awaiting_input`` (``POST /v1/runs/{id}/messages``).

        The post carries ``head_seq`` (default: the run's head now, read
        first), so it lands only while the run still waits where the sender
        saw it (else 409 ``head_moved``) and a retry is never taken as a
        second message. Returns ``None`` when a retry was refused (409
        ``already_posted``, ``head_moved``, ``not_awaiting_input``,
        ``run_finished``) and the run's log shows this text received next
        after ``head_seq`` (an earlier attempt landed; it waits for a
        message still in the inbox to be applied, up to ``max_outage``);
        otherwise (someone else answered) the refusal is raised."""
        return self._run(
            _steps.message(self._http, self._settings, str(run_id), text, head_seq, close=False)
        )

    def close_conversation(
        self, run_id: str, *, text: str | None = None, head_seq: int | None = None
    ) -> models.Accepted | None:
        """End a conversational run parked at ``awaiting_input`` (``POST
        /v1/runs/{id}/close``), with ``head_seq`` as :meth:`send_message`: a
        refused retry returns ``None`` when the log shows the run closed
        right after ``head_seq`` (with ``text`` received first, if given)."""
        return self._run(
            _steps.message(self._http, self._settings, str(run_id), text, head_seq, close=True)
        )

    # --- approvals --------------------------------------------------------------

    def list_approvals(
        self,
        *,
        run_id: str | None = None,
        tool: str | None = None,
        status: str | None = None,
        limit: int | None = None,
    ) -> models.ApprovalPage:
        """Approvals, oldest first (``GET /v1/approvals``): ``status``
        ``pending`` (default) or ``all``."""
        return self._call(
            ops.list_approvals(
                run_id=str(run_id) if run_id else None, tool=tool, status=status, limit=limit
            )
        )

    def approve(
        self, run_id: str, call_id: str, *, args_hash: str | None = None
    ) -> models.Accepted | None:
        """Approve a call as proposed (``POST
        /v1/runs/{id}/approvals/{call_id}``).

        ``args_hash``: the pending call's hash as you saw it; when the
        arguments changed since, 409 ``stale_args``. The first decision wins:
        a call decided already is 409 ``already_decided``. After a retry
        (the answer of an earlier attempt was lost), ``already_decided`` or
        ``run_finished`` returns ``None`` only when the call's recorded
        decision (``approval.resolved``) is this one; someone else's
        decision is raised."""
        return self._run(
            _steps.decide(self._http, self._settings, str(run_id), call_id, "approve", args_hash=args_hash)
        )

    def reject(
        self, run_id: str, call_id: str, *, reason: str | None = None, args_hash: str | None = None
    ) -> models.Accepted | None:
        """Reject a call; the model sees ``reason``. As :meth:`approve`."""
        return self._run(
            _steps.decide(
                self._http, self._settings, str(run_id), call_id, "reject",
                reason=reason, args_hash=args_hash,
            )
        )

    def edit(
        self,
        run_id: str,
        call_id: str,
        input: Mapping[str, Any],
        *,
        args_hash: str | None = None,
    ) -> models.Accepted | None:
        """Approve a call with replacement arguments ``input`` (a JSON
        object, checked against the tool's input schema). As :meth:`approve`."""
        return self._run(
            _steps.decide(
                self._http, self._settings, str(run_id), call_id, "edit",
                input=input, args_hash=args_hash,
            )
        )

    def decide_many(
        self, decisions: Iterable[Mapping[str, Any] | models.BulkDecision1 | models.BulkDecision2]
    ) -> models.BulkResults:
        """Decide up to 100 approvals in one request (``POST /v1/approvals``);
        each decision (``run_id``, ``call_id``, ``decision``: ``approve``,
        ``reject`` or ``edit``, and ``reason``, ``input``, ``args_hash``) is
        applied on its own, and its result carries the status the single
        endpoint would have answered. The request is retried through an
        outage: after a retry, an item's 409 ``already_decided`` may be this
        request's own earlier attempt (read the call's ``approval.resolved``
        to tell)."""
        return self._call(ops.decide_many(decisions))

    # --- agents -------------------------------------------------------------------

    def apply_agent(
        self, definition: Mapping[str, Any] | models.AgentDefinition
    ) -> AppliedAgent:
        """Register an agent definition (``PUT /v1/agents/{name}``):
        content equal to the latest version changes nothing
        (``created=False``); other content becomes the next version."""
        return self._call(ops.apply_agent(definition))

    def apply_agents(
        self, definitions: Iterable[Mapping[str, Any] | models.AgentDefinition]
    ) -> list[AppliedAgent]:
        """:meth:`apply_agent` for each definition, after checking that no
        two share a name (nothing is sent otherwise)."""
        defs = list(definitions)
        ops.check_agent_names(defs)
        return [self.apply_agent(d) for d in defs]

    def get_agent(self, name: str, *, version: int | None = None) -> models.AgentBody:
        """An agent's latest version, or ``version``."""
        return self._call(ops.get_agent(name, version))

    def list_agents(self) -> models.AgentList:
        """The tenant's agents, the latest version of each."""
        return self._call(ops.list_agents())

    # --- batches -----------------------------------------------------------------

    def submit_batch(
        self,
        items: Iterable[Mapping[str, Any] | models.BatchItem] | bytes,
        *,
        config: Mapping[str, Any] | models.RunConfig | None = None,
        agent: str | None = None,
        max_in_flight: int | None = None,
        spend_cap: Mapping[str, int] | models.SpendCapBody | None = None,
        completion_window_secs: int | None = None,
        idempotency_key: str | None = None,
    ) -> models.BatchView:
        """Submit a batch (``POST /v1/batches``, sent as JSON Lines:
        ``docs/batches.md``).

        Args:
            items: The items (``custom_id``, ``goal``, and ``inputs``,
                ``metadata``, ``tags``, ``config`` …), or ``bytes`` of them
                as JSON Lines (e.g. a file's content).
            config, agent: The runs' configuration, or a registered agent.
            max_in_flight, spend_cap, completion_window_secs: Options.
            idempotency_key: As in :meth:`submit` (default: fresh, reused by
                retries).

        Raises:
            ApiError: a refused item refuses the batch; ``item`` is its
                position among ``items`` (1 = the first), ``line`` its line in
                the upload as the dispatcher counts it (``item + 1``: line 1 is
                the spec), ``field`` the field.
        """
        return self._call(
            ops.submit_batch(
                items,
                config=config,
                agent=agent,
                max_in_flight=max_in_flight,
                spend_cap=spend_cap,
                completion_window_secs=completion_window_secs,
                idempotency_key=idempotency_key,
            )
        )

    def get_batch(self, batch_id: str) -> models.BatchView:
        """A batch's progress: status, counts, spend (``GET /v1/batches/{id}``)."""
        return self._call(ops.get_batch(str(batch_id)))

    def list_batches(self, *, after: str | None = None, limit: int | None = None) -> models.BatchPage:
        """The tenant's batches, by creation (``GET /v1/batches``)."""
        return self._call(ops.list_batches(after, limit))

    def batch_progress(self, batch_id: str) -> Iterator[models.BatchView]:
        """The batch's view at once and whenever it changes, until nothing is
        left to run (``GET /v1/batches/{id}/stream``); a broken stream is
        reopened (it starts with the view as it is then)."""
        return self._iterate(_steps.batch_progress(self._http, self._settings, str(batch_id)))

    def wait_batch(self, batch_id: str, *, timeout: float | None = None) -> models.BatchView:
        """Follow :meth:`batch_progress` until nothing is left to run (or
        ``timeout`` seconds: :class:`~glia_client.errors.WaitTimeout`), and
        return the batch's view then."""
        deadline = time.monotonic() + timeout if timeout is not None else None
        return self._run(_steps.wait_batch(self._http, self._settings, str(batch_id), deadline))

    def batch_results(self, batch_id: str) -> Iterator[models.ItemResult]:
        """Every item's result in submission order (``GET
        /v1/batches/{id}/results``, JSON Lines read as they arrive); an item
        still going shows its status. A read that breaks is resumed after
        the results already yielded."""
        return self._iterate(_steps.batch_results(self._http, self._settings, str(batch_id)))

    def cancel_batch(self, batch_id: str) -> models.BatchView:
        """Cancel a batch: items not started are cancelled, runs get a cancel."""
        return self._call(ops.batch_control(str(batch_id), "cancel"))

    def pause_batch(self, batch_id: str) -> models.BatchView:
        """Pause a batch (409 ``batch_ended`` once it ended)."""
        return self._call(ops.batch_control(str(batch_id), "pause"))

    def resume_batch(
        self, batch_id: str, *, spend_cap: Mapping[str, int] | models.SpendCapBody | None = None
    ) -> models.BatchView:
        """Resume a paused batch, optionally with a new ``spend_cap``."""
        body = ops.without_none(spend_cap=spend_cap)
        return self._call(ops.batch_control(str(batch_id), "resume", body))

    # --- webhooks ---------------------------------------------------------------

    def create_webhook(
        self, url: str, *, events: Sequence[str] | None = None, format: str | None = None
    ) -> models.Created:
        """Subscribe ``url`` to ``events`` (default: all). The answer's
        ``secret`` (``whsec_…``) is shown only now: keep it to verify
        deliveries (:func:`glia_client.webhooks.verify`). Not repeated when
        the answer is lost (:class:`~glia_client.errors.ConnectionLostError`)."""
        return self._call(ops.create_webhook(url, events, format))

    def list_webhooks(self) -> models.Subscriptions:
        """The tenant's subscriptions (no secrets)."""
        return self._call(ops.list_webhooks())

    def delete_webhook(self, webhook_id: str) -> None:
        """Delete a subscription (404 ``webhook_not_found`` if there is none)."""
        self._call(ops.delete_webhook(str(webhook_id)))

    def webhook_deliveries(self, webhook_id: str) -> models.Deliveries:
        """A subscription's delivery log, newest first."""
        return self._call(ops.webhook_deliveries(str(webhook_id)))


def _cut_at(response: httpx.Response, deadline: float | None) -> threading.Timer | None:
    """A timer that shuts the answer's socket down at ``deadline``
    (``time.monotonic()``), waking a read blocked on it (the read then fails
    as a transport error); ``None`` without a deadline. Cancel it once the
    read returned."""
    if deadline is None:
        return None

    def shut() -> None:
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    timer = threading.Timer(max(deadline - time.monotonic(), 0.0), shut)
    timer.daemon = True
    timer.start()
    return timer
