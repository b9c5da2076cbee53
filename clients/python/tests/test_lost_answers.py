"""Answers lost between the client and the dispatcher, against the real
fleet: a gateway in between (``http_proxy.LosingProxy``) answers 503
without relaying, or relays and loses the answer. After a retry a payload
is reported done (``None``) only when the run's log shows this payload's
own effect; someone else's is raised; pause and resume are not repeated
once sent. And ``wait`` / batch progress against what the dispatcher does
meanwhile (a payload that moves a parked run, a timer, a stream that
ends early)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import (
    CHAT,
    EXTERNAL,
    REFUND,
    SLOW,
    TWO_ANSWERS,
    WAIT,
    parked_for_approval,
    parked_for_input,
    refunds_of,
)
from http_proxy import Act, LosingProxy, Request

from glia_client import ApiError, Client, ConflictError, ConnectionLostError, models


@pytest.fixture
def proxies(glia_url: str) -> Iterator[Callable[..., LosingProxy]]:
    made: list[LosingProxy] = []

    def make(plan: Callable[[Request], object]) -> LosingProxy:
        p = LosingProxy(glia_url, plan)  # type: ignore[arg-type]
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()
        assert all(r.hook_error is None for r in p.requests), [r.hook_error for r in p.requests]


def first(method: str, suffix: str, act: Act, hook: Callable[[], object] | None = None) -> Callable[[Request], object]:
    """A plan: the first request ``method`` to a path ending in ``suffix``
    gets ``act`` (after ``hook``); everything else is relayed."""

    def plan(req: Request) -> object:
        if req.method == method and req.path.endswith(suffix) and req.n == 0:
            return (act, hook) if hook is not None else act
        return Act.FORWARD

    return plan


def statuses(proxy: LosingProxy, method: str, suffix: str) -> list[int | None]:
    """What the dispatcher answered each relayed request (``None``: not relayed)."""
    return [r.upstream_status for r in proxy.requests if r.method == method and r.path.endswith(suffix)]


def test_a_retried_decision_that_finds_another_decision_is_raised(
    client: Client, token: str, proxies: Callable[..., LosingProxy], effects_file: Path
) -> None:
    run, row = parked_for_approval(client, "Refund order A1 (two approvers race).")
    # An operator pause holds the run once B's decision lets it go on, so
    # A's retry finds the call decided (not a later turn or the run's end).
    client.pause(run.run_id, reason="hold after the decision")
    # A's approve is answered 503 by the gateway, never sent; B rejects meanwhile.
    proxy = proxies(
        first("POST", f"/approvals/{row.call_id}", Act.UNSENT,
              lambda: client.reject(run.run_id, row.call_id, reason="B was first"))
    )
    with Client(proxy.url, token, max_outage=60) as a:
        with pytest.raises(ApiError) as err:
            a.approve(run.run_id, row.call_id)
    # Decided (409), or the run already past the call's turn (404) or done (409).
    assert err.value.code in ("already_decided", "call_not_found", "run_finished"), err.value
    assert err.value.attempts == 2
    assert statuses(proxy, "POST", f"/approvals/{row.call_id}") in ([None, 409], [None, 404])
    [resolved] = [e for e in client.iter_events(run.run_id) if e.type == "approval.resolved"]
    assert resolved.data["decision"] == {"kind": "reject", "reason": "B was first"}, resolved.data
    client.cancel(run.run_id, reason="cleanup")
    client.wait(run.run_id, until="done", timeout=WAIT)
    assert refunds_of(effects_file, run.run_id) == [], "B's reject stands"


def test_a_decision_whose_answer_was_lost_is_done_even_once_the_run_finished(
    client: Client, token: str, proxies: Callable[..., LosingProxy], effects_file: Path
) -> None:
    run, row = parked_for_approval(client, "Refund order A1 (answer lost).")
    # The edit lands; its answer is lost while the run goes on to its end,
    # so the retry finds the run finished (409 run_finished).
    proxy = proxies(
        first("POST", f"/approvals/{row.call_id}", Act.LOST,
              lambda: client.wait(run.run_id, after=run.head_seq, until="done", timeout=WAIT))
    )
    with Client(proxy.url, token, max_outage=60) as through:
        assert through.edit(run.run_id, row.call_id, {"order_id": "B7"}, args_hash=row.args_hash) is None
    assert statuses(proxy, "POST", f"/approvals/{row.call_id}") == [202, 409]
    assert len(refunds_of(effects_file, run.run_id)) == 1, "the edited refund ran once"


def test_a_tool_result_whose_answer_was_lost_is_done_and_another_is_raised(
    client: Client, token: str, proxies: Callable[..., LosingProxy]
) -> None:
    run = client.submit("Look orders A1 and B2 up, outside (answers lost).", config=EXTERNAL)
    run = client.wait(run.run_id, timeout=WAIT)
    assert run.pull_point is not None and run.pull_point.kind == "awaiting_tool", run
    [a1] = run.pull_point.call_ids or []
    lost = proxies(
        first("POST", f"/tool-results/{a1}", Act.LOST,
              lambda: client.wait(run.run_id, after=run.head_seq, timeout=WAIT))
    )
    with Client(lost.url, token, max_outage=60) as through:
        assert through.post_tool_result(run.run_id, a1, {"order_id": "A1", "status": "delivered"}) is None
    # The retry finds the call answered (409), or the run past its turn (404).
    assert statuses(lost, "POST", f"/tool-results/{a1}") in ([202, 409], [202, 404])

    waiting = client.get_run(run.run_id)
    assert waiting.pull_point is not None and waiting.pull_point.kind == "awaiting_tool", waiting
    [b2] = waiting.pull_point.call_ids or []
    # Our B2 result never leaves the gateway; another system's does.
    raced = proxies(
        first("POST", f"/tool-results/{b2}", Act.UNSENT,
              lambda: client.post_tool_result(run.run_id, b2, "someone else's result"))
    )
    with Client(raced.url, token, max_outage=60) as through:
        with pytest.raises(ApiError) as err:
            through.post_tool_result(run.run_id, b2, {"order_id": "B2", "status": "shipped"})
    assert err.value.code in ("already_answered", "call_not_found", "run_finished"), err.value
    assert err.value.attempts == 2
    client.wait(run.run_id, after=waiting.head_seq, until="done", timeout=WAIT)


def test_a_message_whose_answer_was_lost_is_done(
    client: Client, token: str, proxies: Callable[..., LosingProxy]
) -> None:
    run = parked_for_input(client, "Hello (answer lost).", TWO_ANSWERS)
    proxy = proxies(
        first("POST", "/messages", Act.LOST, lambda: client.wait(run.run_id, after=run.head_seq, timeout=WAIT))
    )
    with Client(proxy.url, token, max_outage=60) as through:
        assert through.send_message(run.run_id, "One more thing.", head_seq=run.head_seq) is None
    assert statuses(proxy, "POST", "/messages") == [202, 409]
    texts = [e.data.get("text") for e in client.iter_events(run.run_id) if e.type == "input.received"]
    assert texts == ["One more thing."]
    client.close_conversation(run.run_id)


def test_a_retried_message_that_finds_another_message_is_raised(
    client: Client, token: str, proxies: Callable[..., LosingProxy]
) -> None:
    run = parked_for_input(client, "Hello (two senders).", TWO_ANSWERS)
    proxy = proxies(
        first("POST", "/messages", Act.UNSENT,
              lambda: client.send_message(run.run_id, "Someone else's words.", head_seq=run.head_seq))
    )
    with Client(proxy.url, token, max_outage=60) as through:
        with pytest.raises(ConflictError) as err:
            through.send_message(run.run_id, "Mine.", head_seq=run.head_seq)
    assert err.value.code in ("already_posted", "head_moved"), err.value
    answered = client.wait(run.run_id, after=run.head_seq, timeout=WAIT)
    texts = [e.data.get("text") for e in client.iter_events(run.run_id) if e.type == "input.received"]
    assert texts == ["Someone else's words."]
    client.close_conversation(run.run_id, head_seq=answered.head_seq)


def test_a_close_whose_answer_was_lost_is_done_once_the_run_finished(
    client: Client, token: str, proxies: Callable[..., LosingProxy]
) -> None:
    run = parked_for_input(client, "Hello, briefly (close lost).", CHAT)
    proxy = proxies(
        first("POST", "/close", Act.LOST,
              lambda: client.wait(run.run_id, after=run.head_seq, until="done", timeout=WAIT))
    )
    with Client(proxy.url, token, max_outage=60) as through:
        assert through.close_conversation(run.run_id, head_seq=run.head_seq) is None
    assert statuses(proxy, "POST", "/close") == [202, 409]
    done = client.get_run(run.run_id)
    assert done.outcome is not None and done.outcome.kind == "succeeded", done


def test_pause_and_resume_are_not_repeated_once_sent(
    client: Client, token: str, proxies: Callable[..., LosingProxy]
) -> None:
    run, row = parked_for_approval(client, "Refund order A1 (pause and resume lost).")

    def plan(req: Request) -> object:
        if req.method == "POST" and req.path.endswith(("/pause", "/resume")):
            return Act.LOST
        return Act.FORWARD

    proxy = proxies(plan)
    with Client(proxy.url, token, max_outage=60) as through:
        with pytest.raises(ConnectionLostError):
            through.pause(run.run_id, reason="hold")
        with pytest.raises(ConnectionLostError):
            through.resume(run.run_id)
    assert statuses(proxy, "POST", "/pause") == [202], "sent once"
    assert statuses(proxy, "POST", "/resume") == [202], "sent once"
    client.reject(run.run_id, row.call_id, reason="cleanup")
    client.wait(run.run_id, after=run.head_seq, until="done", timeout=WAIT)


def test_a_post_that_is_not_idempotent_is_repeated_only_after_not_ready(
    client: Client, token: str, proxies: Callable[..., LosingProxy]
) -> None:
    hook = "http://127.0.0.1:9/glia-not-ready"  # nobody listens; deleted at once
    ready = proxies(first("POST", "/v1/webhooks", Act.NOT_READY))
    with Client(ready.url, token, max_outage=60) as through:
        created = through.create_webhook(hook, events=["run.completed"])
    assert statuses(ready, "POST", "/v1/webhooks") == [None, 201]
    client.delete_webhook(created.id)
    # A gateway's 503 may follow the effect: not repeated.
    gateway = proxies(first("POST", "/v1/webhooks", Act.UNSENT))
    with Client(gateway.url, token, max_outage=60) as through:
        with pytest.raises(ConnectionLostError):
            through.create_webhook(hook, events=["run.completed"])
    assert statuses(gateway, "POST", "/v1/webhooks") == [None]


def test_wait_sees_a_payload_that_moves_a_parked_run(
    client: Client, token: str, proxies: Callable[..., LosingProxy]
) -> None:
    run, row = parked_for_approval(client, "Refund order A1 (paused while parked).")
    # As the wait starts following, an operator asks for a pause: the run
    # records session.pause_requested and stays at its approval.
    proxy = proxies(first("GET", "/events/stream", Act.FORWARD, lambda: client.pause(run.run_id, reason="hold")))
    with Client(proxy.url, token, max_outage=60) as through:
        moved = through.wait(run.run_id, after=run.head_seq, timeout=WAIT)
    assert moved.head_seq > run.head_seq, moved
    assert moved.pull_point is not None and moved.pull_point.kind == "awaiting_approval", moved
    kinds = [e.type for e in client.iter_events(run.run_id, after=run.head_seq)]
    assert "session.pause_requested" in kinds, kinds
    client.cancel(run.run_id, reason="cleanup")
    client.wait(run.run_id, until="done", timeout=WAIT)


def test_wait_goes_on_past_a_pull_point_nobody_answers(
    client: Client, token: str, proxies: Callable[..., LosingProxy]
) -> None:
    run = client.submit("Sleep, then answer (a timer).", config=SLOW)

    def at_the_timer() -> None:
        parked = client.wait(run.run_id, pull_points={"awaiting_timer"}, timeout=WAIT)
        assert parked.status == "done" or (
            parked.pull_point is not None and parked.pull_point.kind == "awaiting_timer"
        ), parked

    # The wait's first read comes once the run sleeps (parked at awaiting_timer).
    proxy = proxies(first("GET", f"/v1/runs/{run.run_id}", Act.FORWARD, at_the_timer))
    with Client(proxy.url, token, max_outage=60) as through:
        done = through.wait(run.run_id, timeout=WAIT)
    assert done.status == "done" and done.outcome is not None and done.outcome.answer == "Waited.", done


def stream_ends_early_then_cancel(client: Client, batch_id: str) -> Callable[[Request], object]:
    """A plan: the batch's first progress stream ends cleanly after its
    first frame; as the second opens, the batch is cancelled."""

    def plan(req: Request) -> object:
        if req.method == "GET" and req.path.endswith("/stream"):
            if req.n == 0:
                return Act.FIRST_FRAME
            if req.n == 1:
                return (Act.FORWARD, lambda: client.cancel_batch(batch_id))
        return Act.FORWARD

    return plan


def test_batch_progress_and_wait_go_on_past_a_stream_that_ends_early(
    client: Client, token: str, proxies: Callable[..., LosingProxy]
) -> None:
    # Items that wait for an approval: the batch cannot end by itself.
    items = [{"custom_id": "r1", "goal": "Refund order A1."}]
    batch = client.submit_batch(items, config=REFUND)
    proxy = proxies(stream_ends_early_then_cancel(client, batch.id))
    with Client(proxy.url, token, max_outage=60) as through:
        views: list[models.BatchView] = list(through.batch_progress(batch.id))
    assert views[0].status not in ("completed", "expired", "cancelled"), views[0]
    assert views[-1].status == "cancelled", views[-1]
    assert len(statuses(proxy, "GET", "/stream")) >= 2

    other = client.submit_batch(items, config=REFUND)
    proxy = proxies(stream_ends_early_then_cancel(client, other.id))
    with Client(proxy.url, token, max_outage=60) as through:
        final = through.wait_batch(other.id, timeout=WAIT)
    assert final.status == "cancelled", final
