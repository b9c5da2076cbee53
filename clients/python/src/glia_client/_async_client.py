"""The asynchronous client, :class:`AsyncClient`: :class:`Client`'s methods
as coroutines (asyncio or trio, through httpx and anyio). Both send what
``_ops`` builds and follow ``_core``'s retry and stream state; only the
sending and sleeping differ."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, cast

import anyio
import httpx
from httpx_sse import EventSource

from . import _ops as ops
from . import _steps, models
from ._core import AppliedAgent, Call, EventFollow, Outage, Settings, WaitPlan
from ._steps import Close, Emit, NextFrame, NextLine, Open, ReadAll, Send, Sleep, Steps

T = TypeVar("T")


class AsyncClient:
    """An asynchronous client of the glia dispatcher's HTTP API: every method
    of :class:`~glia_client.Client`, awaited (iterators are async
    iterators). Arguments as :class:`~glia_client.Client`'s; ``http`` is an
    ``httpx.AsyncClient``. Use ``async with``, or ``await aclose()``."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        max_outage: float | None = None,
        timeout: httpx.Timeout | float | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._settings = Settings.of(base_url, token, max_outage, timeout)
        self._own = http is None
        self._http = http or httpx.AsyncClient()
        self._http.base_url = httpx.URL(self._settings.base_url)

    # --- plumbing ---------------------------------------------------------

    async def aclose(self) -> None:
        """Close the connections (not those of an ``http`` client passed in)."""
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _drive(self, steps: Steps[Any]) -> AsyncGenerator[tuple[bool, Any], None]:
        """As :meth:`Client._drive`, awaiting each step."""
        opened: dict[int, httpx.Response] = {}
        frames: dict[int, AsyncIterator[Any]] = {}
        lines: dict[int, AsyncIterator[str]] = {}
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
                        reply = await self._http.send(step.request)
                    except httpx.TransportError as e:
                        reply = e
                elif isinstance(step, Sleep):
                    await anyio.sleep(step.seconds)
                elif isinstance(step, Open):
                    try:
                        reply = await self._http.send(step.request, stream=True)
                        opened[id(reply)] = reply
                    except httpx.TransportError as e:
                        reply = e
                elif isinstance(step, ReadAll):
                    try:
                        reply = await step.response.aread()
                    except httpx.TransportError:
                        reply = b""
                    await step.response.aclose()
                elif isinstance(step, NextFrame):
                    it = frames.setdefault(
                        id(step.response), EventSource(step.response).aiter_sse()
                    )
                    wait = (
                        math.inf
                        if step.deadline is None
                        else max(step.deadline - time.monotonic(), 0.0)
                    )
                    try:
                        with anyio.move_on_after(wait) as scope:
                            reply = await anext(it, None)
                        if scope.cancelled_caught:
                            # The deadline cut the read (keep-alives are no
                            # frames): the answer is not read further.
                            frames.pop(id(step.response), None)
                            await it.aclose()
                            reply = httpx.ReadTimeout("the wait's deadline passed")
                    except httpx.TransportError as e:
                        reply = e
                elif isinstance(step, NextLine):
                    it2 = lines.setdefault(id(step.response), step.response.aiter_lines())
                    try:
                        reply = await anext(it2, None)
                    except httpx.TransportError as e:
                        reply = e
                elif isinstance(step, Close):
                    await step.response.aclose()
                    for table in (opened, frames, lines):
                        table.pop(id(step.response), None)
                elif isinstance(step, Emit):
                    yield False, step.item
        finally:
            steps.close()
            for response in opened.values():
                await response.aclose()

    async def _run(self, steps: Steps[T]) -> T:
        """The result of an operation that hands out no items."""
        drive = self._drive(steps)
        try:
            async for done, value in drive:
                if done:
                    return value  # type: ignore[no-any-return]
        finally:
            await drive.aclose()
        raise AssertionError("an operation ended without a result")

    async def _iterate(self, steps: Steps[Any]) -> AsyncIterator[Any]:
        """The items an operation hands out."""
        drive = self._drive(steps)
        try:
            async for done, value in drive:
                if done:
                    return
                yield value
        finally:
            await drive.aclose()

    async def _call(self, call: Call[T]) -> T:
        """As :meth:`Client._call`."""
        return cast(T, await self._run(_steps.call(self._http, self._settings, call)))



    # --- runs ---------------------------------------------------------------

    async def submit(
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
        """As :meth:`Client.submit`."""
        return await self._call(
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

    async def get_run(self, run_id: str) -> models.RunSummary:
        """As :meth:`Client.get_run`."""
        return await self._call(ops.get_run(str(run_id)))

    async def list_runs(self, **filters: Any) -> models.RunPage:
        """As :meth:`Client.list_runs`."""
        return await self._call(ops.list_runs(**filters))

    def iter_runs(self, **filters: Any) -> AsyncIterator[models.RunSummary]:
        """As :meth:`Client.iter_runs`."""
        return self._iterate(_steps.runs(self._http, self._settings, dict(filters)))

    async def events(
        self, run_id: str, *, after: int = 0, limit: int | None = None
    ) -> models.EventPage:
        """As :meth:`Client.events`."""
        return await self._call(ops.events(str(run_id), after, limit))

    def iter_events(self, run_id: str, *, after: int = 0) -> AsyncIterator[models.Event]:
        """As :meth:`Client.iter_events`."""
        return self._iterate(_steps.events(self._http, self._settings, str(run_id), after))

    def stream(
        self, run_id: str, *, after: int = 0, include_live: bool = False
    ) -> AsyncIterator[models.Event | models.LiveEvent]:
        """As :meth:`Client.stream`: every event once, in order, resumed with
        ``Last-Event-ID`` across disconnects."""
        follow = EventFollow(
            str(run_id), after, Outage(self._settings), include_live=include_live
        )
        return self._iterate(_steps.stream(self._http, self._settings, follow))

    async def wait(
        self,
        run_id: str,
        *,
        after: int | None = None,
        until: str = "pull_point",
        timeout: float | None = None,
        pull_points: Iterable[str] | None = None,
    ) -> models.RunSummary:
        """As :meth:`Client.wait`."""
        plan = WaitPlan.of(run_id, after, until, timeout, pull_points)
        return await self._run(_steps.wait(self._http, self._settings, plan))

    async def cancel(self, run_id: str, *, reason: str | None = None) -> models.Accepted | None:
        """As :meth:`Client.cancel`."""
        return await self._call(ops.cancel(str(run_id), reason))

    async def pause(self, run_id: str, *, reason: str | None = None) -> models.Accepted:
        """As :meth:`Client.pause`."""
        return await self._call(ops.pause(str(run_id), reason))

    async def resume(
        self, run_id: str, *, extend: Mapping[str, Any] | models.BudgetLimits | None = None
    ) -> models.Accepted:
        """As :meth:`Client.resume`."""
        return await self._call(ops.resume(str(run_id), extend))

    async def erase(self, run_id: str) -> models.RunSummary:
        """As :meth:`Client.erase`."""
        return await self._call(ops.erase_run(str(run_id)))

    # --- payloads -------------------------------------------------------------

    async def post_tool_result(
        self, run_id: str, call_id: str, content: Any, *, is_error: bool = False
    ) -> models.Accepted | None:
        """As :meth:`Client.post_tool_result`."""
        return await self._run(
            _steps.tool_result(self._http, self._settings, str(run_id), call_id, content, is_error)
        )

    async def send_message(
        self, run_id: str, text: str, *, head_seq: int | None = None
    ) -> models.Accepted | None:
        """As :meth:`Client.send_message`."""
        return await self._run(
            _steps.message(self._http, self._settings, str(run_id), text, head_seq, close=False)
        )

    async def close_conversation(
        self, run_id: str, *, text: str | None = None, head_seq: int | None = None
    ) -> models.Accepted | None:
        """As :meth:`Client.close_conversation`."""
        return await self._run(
            _steps.message(self._http, self._settings, str(run_id), text, head_seq, close=True)
        )

    # --- approvals --------------------------------------------------------------

    async def list_approvals(
        self,
        *,
        run_id: str | None = None,
        tool: str | None = None,
        status: str | None = None,
        limit: int | None = None,
    ) -> models.ApprovalPage:
        """As :meth:`Client.list_approvals`."""
        return await self._call(
            ops.list_approvals(
                run_id=str(run_id) if run_id else None, tool=tool, status=status, limit=limit
            )
        )

    async def approve(
        self, run_id: str, call_id: str, *, args_hash: str | None = None
    ) -> models.Accepted | None:
        """As :meth:`Client.approve`."""
        return await self._run(
            _steps.decide(self._http, self._settings, str(run_id), call_id, "approve", args_hash=args_hash)
        )

    async def reject(
        self, run_id: str, call_id: str, *, reason: str | None = None, args_hash: str | None = None
    ) -> models.Accepted | None:
        """As :meth:`Client.reject`."""
        return await self._run(
            _steps.decide(
                self._http, self._settings, str(run_id), call_id, "reject",
                reason=reason, args_hash=args_hash,
            )
        )

    async def edit(
        self,
        run_id: str,
        call_id: str,
        input: Mapping[str, Any],
        *,
        args_hash: str | None = None,
    ) -> models.Accepted | None:
        """As :meth:`Client.edit`."""
        return await self._run(
            _steps.decide(
                self._http, self._settings, str(run_id), call_id, "edit",
                input=input, args_hash=args_hash,
            )
        )

    async def decide_many(
        self, decisions: Iterable[Mapping[str, Any] | models.BulkDecision1 | models.BulkDecision2]
    ) -> models.BulkResults:
        """As :meth:`Client.decide_many`."""
        return await self._call(ops.decide_many(decisions))

    # --- agents -------------------------------------------------------------------

    async def apply_agent(
        self, definition: Mapping[str, Any] | models.AgentDefinition
    ) -> AppliedAgent:
        """As :meth:`Client.apply_agent`."""
        return await self._call(ops.apply_agent(definition))

    async def apply_agents(
        self, definitions: Iterable[Mapping[str, Any] | models.AgentDefinition]
    ) -> list[AppliedAgent]:
        """As :meth:`Client.apply_agents`."""
        defs = list(definitions)
        ops.check_agent_names(defs)
        return [await self.apply_agent(d) for d in defs]

    async def get_agent(self, name: str, *, version: int | None = None) -> models.AgentBody:
        """As :meth:`Client.get_agent`."""
        return await self._call(ops.get_agent(name, version))

    async def list_agents(self) -> models.AgentList:
        """As :meth:`Client.list_agents`."""
        return await self._call(ops.list_agents())

    # --- batches -----------------------------------------------------------------

    async def submit_batch(
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
        """As :meth:`Client.submit_batch`."""
        return await self._call(
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

    async def get_batch(self, batch_id: str) -> models.BatchView:
        """As :meth:`Client.get_batch`."""
        return await self._call(ops.get_batch(str(batch_id)))

    async def list_batches(
        self, *, after: str | None = None, limit: int | None = None
    ) -> models.BatchPage:
        """As :meth:`Client.list_batches`."""
        return await self._call(ops.list_batches(after, limit))

    def batch_progress(self, batch_id: str) -> AsyncIterator[models.BatchView]:
        """As :meth:`Client.batch_progress`."""
        return self._iterate(_steps.batch_progress(self._http, self._settings, str(batch_id)))

    async def wait_batch(
        self, batch_id: str, *, timeout: float | None = None
    ) -> models.BatchView:
        """As :meth:`Client.wait_batch`."""
        deadline = time.monotonic() + timeout if timeout is not None else None
        return await self._run(_steps.wait_batch(self._http, self._settings, str(batch_id), deadline))

    def batch_results(self, batch_id: str) -> AsyncIterator[models.ItemResult]:
        """As :meth:`Client.batch_results`."""
        return self._iterate(_steps.batch_results(self._http, self._settings, str(batch_id)))

    async def cancel_batch(self, batch_id: str) -> models.BatchView:
        """As :meth:`Client.cancel_batch`."""
        return await self._call(ops.batch_control(str(batch_id), "cancel"))

    async def pause_batch(self, batch_id: str) -> models.BatchView:
        """As :meth:`Client.pause_batch`."""
        return await self._call(ops.batch_control(str(batch_id), "pause"))

    async def resume_batch(
        self, batch_id: str, *, spend_cap: Mapping[str, int] | models.SpendCapBody | None = None
    ) -> models.BatchView:
        """As :meth:`Client.resume_batch`."""
        body = ops.without_none(spend_cap=spend_cap)
        return await self._call(ops.batch_control(str(batch_id), "resume", body))

    # --- webhooks ---------------------------------------------------------------

    async def create_webhook(
        self, url: str, *, events: Sequence[str] | None = None, format: str | None = None
    ) -> models.Created:
        """As :meth:`Client.create_webhook`."""
        return await self._call(ops.create_webhook(url, events, format))

    async def list_webhooks(self) -> models.Subscriptions:
        """As :meth:`Client.list_webhooks`."""
        return await self._call(ops.list_webhooks())

    async def delete_webhook(self, webhook_id: str) -> None:
        """As :meth:`Client.delete_webhook`."""
        await self._call(ops.delete_webhook(str(webhook_id)))

    async def webhook_deliveries(self, webhook_id: str) -> models.Deliveries:
        """As :meth:`Client.webhook_deliveries`."""
        return await self._call(ops.webhook_deliveries(str(webhook_id)))
