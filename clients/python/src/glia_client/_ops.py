"""Each operation's request as a :class:`~glia_client._core.Call`: path,
query, body, headers and how its answer is read. :class:`Client` and
:class:`AsyncClient` send these; neither builds a request itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from . import _endpoints as ep
from . import models
from ._core import (
    AppliedAgent,
    Call,
    agent_name,
    applied_agent,
    batch_upload,
    batch_item,
    model_parser,
    new_idempotency_key,
    to_jsonable,
    without_none,
)

# After a retry, these 409 codes may mean an earlier attempt of the same
# post landed (its answer was lost), or that someone else's did: the
# operation then reads the run's log for this post's own effect
# (``call_not_found``: the run went on past the call's turn)
# (``_steps.posted``) before it reports success. A cancel applied leaves the
# run finished, which is what a cancel asks for, whoever finished it.
DECISION_LANDED = frozenset({"already_decided", "call_not_found", "run_finished"})
RESULT_LANDED = frozenset({"already_answered", "call_not_found", "run_finished"})
INPUT_LANDED = frozenset({"already_posted", "head_moved", "not_awaiting_input", "run_finished"})
CANCEL_LANDED = frozenset({"run_finished"})


def submit(
    goal: str,
    *,
    config: Mapping[str, Any] | models.RunConfig | None,
    agent: str | None,
    batch_id: str | None,
    tags: Sequence[str] | None,
    metadata: Mapping[str, str] | None,
    start_at: datetime | str | None,
    idempotency_key: str | None,
) -> Call[models.RunSummary]:
    """``POST /v1/runs`` with an ``Idempotency-Key`` (fresh unless given):
    every retry of this call carries the same key, so the dispatcher answers
    the run the first attempt created instead of creating another."""
    if isinstance(start_at, datetime):
        if start_at.tzinfo is None:
            raise ValueError("start_at must carry a time zone (e.g. datetime.now(timezone.utc))")
        start_at = start_at.isoformat()
    body = without_none(
        goal=goal,
        config=config,
        agent=agent,
        batch_id=str(batch_id) if batch_id is not None else None,
        tags=list(tags) if tags is not None else None,
        metadata=metadata,
        start_at=start_at,
    )
    return Call(
        ep.CREATE_RUN,
        json=body,
        headers={"Idempotency-Key": idempotency_key or new_idempotency_key()},
        parse=model_parser(models.RunSummary),
    )


def get_run(run_id: str) -> Call[models.RunSummary]:
    """``GET /v1/runs/{id}``."""
    return Call(ep.GET_RUN, {"id": run_id}, parse=model_parser(models.RunSummary))


def list_runs(
    *,
    status: str | None = None,
    outcome: str | None = None,
    agent: str | None = None,
    version: int | None = None,
    batch_id: str | None = None,
    tags: Sequence[str] = (),
    metadata: Mapping[str, str] | None = None,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    error: str | None = None,
    tenant: str | None = None,
    parent: str | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[models.RunPage]:
    """``GET /v1/runs`` (``docs/runs.md``): every filter given must match."""
    query: list[tuple[str, str]] = []
    for name, value in (
        ("status", status),
        ("outcome", outcome),
        ("agent", agent),
        ("version", version),
        ("batch_id", batch_id),
        ("since", since.isoformat() if isinstance(since, datetime) else since),
        ("until", until.isoformat() if isinstance(until, datetime) else until),
        ("error", error),
        ("tenant", tenant),
        ("parent", parent),
        ("limit", limit),
        ("cursor", cursor),
    ):
        if value is not None:
            query.append((name, str(value)))
    query.extend(("tag", t) for t in tags)
    query.extend(("meta", f"{k}={v}") for k, v in (metadata or {}).items())
    return Call(ep.LIST_RUNS, query=query, parse=model_parser(models.RunPage))


def events(run_id: str, after: int, limit: int | None) -> Call[models.EventPage]:
    """``GET /v1/runs/{id}/events``: events with ``seq > after``."""
    query = [("after", str(after))]
    if limit is not None:
        query.append(("limit", str(limit)))
    return Call(
        ep.LIST_EVENTS, {"id": run_id}, query=query, parse=model_parser(models.EventPage)
    )


def erase_run(run_id: str) -> Call[models.RunSummary]:
    """``DELETE /v1/runs/{id}`` (scope ``erase``; idempotent)."""
    return Call(ep.ERASE_RUN, {"id": run_id}, parse=model_parser(models.RunSummary))


def list_approvals(
    *, run_id: str | None, tool: str | None, status: str | None, limit: int | None
) -> Call[models.ApprovalPage]:
    """``GET /v1/approvals``, oldest first."""
    query = [
        (k, str(v))
        for k, v in (("run_id", run_id), ("tool", tool), ("status", status), ("limit", limit))
        if v is not None
    ]
    return Call(ep.LIST_APPROVALS, query=query, parse=model_parser(models.ApprovalPage))


def decide(
    run_id: str,
    call_id: str,
    decision: str,
    *,
    reason: str | None = None,
    input: Mapping[str, Any] | None = None,
    args_hash: str | None = None,
) -> Call[models.Accepted]:
    """``POST /v1/runs/{id}/approvals/{call_id}``."""
    body = without_none(decision=decision, reason=reason, input=input, args_hash=args_hash)
    return Call(
        ep.DECIDE,
        {"id": run_id, "call_id": call_id},
        json=body,
        parse=model_parser(models.Accepted),
    )


def decide_many(decisions: Iterable[Mapping[str, Any] | models.BulkDecision1 | models.BulkDecision2]) -> Call[models.BulkResults]:
    """``POST /v1/approvals``: each decision a mapping with ``run_id``,
    ``call_id``, ``decision`` (``approve``, ``reject``, ``edit``) and
    optionally ``reason``, ``input``, ``args_hash``. Retried through an
    outage (each decision is deduplicated per call): after a retry an item's
    409 ``already_decided`` may be this request's own earlier attempt."""
    items = []
    for d in decisions:
        item = to_jsonable(d)
        items.append({k: (str(v) if k == "run_id" else v) for k, v in item.items() if v is not None})
    return Call(
        ep.DECIDE_BULK, json={"decisions": items}, parse=model_parser(models.BulkResults)
    )


def tool_result(
    run_id: str, call_id: str, content: Any, is_error: bool
) -> Call[models.Accepted]:
    """``POST /v1/runs/{id}/tool-results/{call_id}``; a result that is not a
    string is sent as its JSON text."""
    import json

    text = content if isinstance(content, str) else json.dumps(to_jsonable(content))
    return Call(
        ep.POST_TOOL_RESULT,
        {"id": run_id, "call_id": call_id},
        json={"content": text, "is_error": is_error},
        parse=model_parser(models.Accepted),
    )


def message(run_id: str, text: str, head_seq: int) -> Call[models.Accepted]:
    """``POST /v1/runs/{id}/messages`` with ``head_seq``: posted only while
    the run's head is still there, so a retry is never taken as the user's
    next message."""
    return Call(
        ep.POST_MESSAGE,
        {"id": run_id},
        json={"text": text, "head_seq": head_seq},
        parse=model_parser(models.Accepted),
    )


def close(run_id: str, text: str | None, head_seq: int) -> Call[models.Accepted]:
    """``POST /v1/runs/{id}/close`` with ``head_seq`` (as :func:`message`)."""
    return Call(
        ep.CLOSE_RUN,
        {"id": run_id},
        json=without_none(text=text, head_seq=head_seq),
        parse=model_parser(models.Accepted),
    )


def cancel(run_id: str, reason: str | None) -> Call[models.Accepted]:
    """``POST /v1/runs/{id}/cancel`` (a repeat while the cancel waits
    answers it again; once applied, 409 ``run_finished``)."""
    return Call(
        ep.CANCEL_RUN,
        {"id": run_id},
        json=without_none(reason=reason),
        parse=model_parser(models.Accepted),
        landed=CANCEL_LANDED,
    )


def pause(run_id: str, reason: str | None) -> Call[models.Accepted]:
    """``POST /v1/runs/{id}/pause`` (not repeated once it may have been
    sent: a resumed run may be paused again by the repeat)."""
    return Call(
        ep.PAUSE_RUN,
        {"id": run_id},
        json=without_none(reason=reason),
        parse=model_parser(models.Accepted),
    )


def resume(
    run_id: str, extend: Mapping[str, Any] | models.BudgetLimits | None
) -> Call[models.Accepted]:
    """``POST /v1/runs/{id}/resume`` (``extend``: amounts added to the
    run's budget limits; not repeated once it may have been sent: a repeat
    after the run paused again would add ``extend`` twice)."""
    return Call(
        ep.RESUME_RUN,
        {"id": run_id},
        json=without_none(extend=extend),
        parse=model_parser(models.Accepted),
    )


def apply_agent(definition: Mapping[str, Any] | models.AgentDefinition) -> Call[AppliedAgent]:
    """``PUT /v1/agents/{name}``."""
    return Call(
        ep.PUT_AGENT,
        {"name": agent_name(definition)},
        json=to_jsonable(definition),
        parse=applied_agent,
    )


def get_agent(name: str, version: int | None) -> Call[models.AgentBody]:
    """``GET /v1/agents/{name}`` (the latest) or its ``version``."""
    if version is None:
        return Call(ep.GET_AGENT, {"name": name}, parse=model_parser(models.AgentBody))
    return Call(
        ep.GET_AGENT_VERSION,
        {"name": name, "version": version},
        parse=model_parser(models.AgentBody),
    )


def list_agents() -> Call[models.AgentList]:
    """``GET /v1/agents``."""
    return Call(ep.LIST_AGENTS, parse=model_parser(models.AgentList))


def submit_batch(
    items: Iterable[Mapping[str, Any] | models.BatchItem] | bytes,
    *,
    config: Mapping[str, Any] | models.RunConfig | None,
    agent: str | None,
    max_in_flight: int | None,
    spend_cap: Mapping[str, int] | models.SpendCapBody | None,
    completion_window_secs: int | None,
    idempotency_key: str | None,
) -> Call[models.BatchView]:
    """``POST /v1/batches`` as JSON Lines with an ``Idempotency-Key``."""
    body = batch_upload(
        items,
        config=config,
        agent=agent,
        options={
            "max_in_flight": max_in_flight,
            "spend_cap": spend_cap,
            "completion_window_secs": completion_window_secs,
        },
    )
    return Call(
        ep.CREATE_BATCH,
        content=body,
        headers={
            "Content-Type": "application/jsonl",
            "Idempotency-Key": idempotency_key or new_idempotency_key(),
        },
        parse=model_parser(models.BatchView),
        fix_error=batch_item,
    )


def get_batch(batch_id: str) -> Call[models.BatchView]:
    """``GET /v1/batches/{id}``."""
    return Call(ep.GET_BATCH, {"id": batch_id}, parse=model_parser(models.BatchView))


def list_batches(after: str | None, limit: int | None) -> Call[models.BatchPage]:
    """``GET /v1/batches``."""
    query = [(k, str(v)) for k, v in (("after", after), ("limit", limit)) if v is not None]
    return Call(ep.LIST_BATCHES, query=query, parse=model_parser(models.BatchPage))


def batch_results(batch_id: str) -> Call[None]:
    """``GET /v1/batches/{id}/results`` (read as a stream of JSON Lines)."""
    return Call(ep.BATCH_RESULTS, {"id": batch_id})


def batch_stream(batch_id: str) -> Call[None]:
    """``GET /v1/batches/{id}/stream`` (SSE ``progress`` frames)."""
    return Call(ep.BATCH_STREAM, {"id": batch_id}, headers={"Accept": "text/event-stream"})


def batch_control(batch_id: str, action: str, body: Any = None) -> Call[models.BatchView]:
    """``POST /v1/batches/{id}/{cancel|pause|resume}``."""
    endpoint = {"cancel": ep.CANCEL_BATCH, "pause": ep.PAUSE_BATCH, "resume": ep.RESUME_BATCH}[
        action
    ]
    call: Call[models.BatchView] = Call(
        endpoint, {"id": batch_id}, parse=model_parser(models.BatchView)
    )
    if body is not None:
        call.json = body
    return call


def create_webhook(
    url: str, events: Sequence[str] | None, format: str | None
) -> Call[models.Created]:
    """``POST /v1/webhooks``: the answer carries the ``whsec_`` secret, once."""
    return Call(
        ep.CREATE_WEBHOOK,
        json=without_none(url=url, events=list(events) if events is not None else None, format=format),
        parse=model_parser(models.Created),
    )


def list_webhooks() -> Call[models.Subscriptions]:
    """``GET /v1/webhooks``."""
    return Call(ep.LIST_WEBHOOKS, parse=model_parser(models.Subscriptions))


def delete_webhook(webhook_id: str) -> Call[None]:
    """``DELETE /v1/webhooks/{id}`` (a repeat after a lost answer finds it
    gone: done)."""
    return Call(ep.DELETE_WEBHOOK, {"id": webhook_id}, landed=frozenset({"webhook_not_found"}))


def webhook_deliveries(webhook_id: str) -> Call[models.Deliveries]:
    """``GET /v1/webhooks/{id}/deliveries``, newest first."""
    return Call(
        ep.WEBHOOK_DELIVERIES, {"id": webhook_id}, parse=model_parser(models.Deliveries)
    )


def check_agent_names(definitions: Sequence[Any]) -> None:
    """Refuse definitions that share a name (before any is sent)."""
    seen: set[str] = set()
    for d in definitions:
        name = agent_name(d)
        if name in seen:
            raise ValueError(f"two definitions define agent {name!r}")
        seen.add(name)
