"""Runs against the real fleet: submit and get the answer (blocking and
async), idempotent submission, listing, event pages, typed errors, and a
tenant that cannot see another's run."""

from __future__ import annotations

import uuid

import pytest
from conftest import ANSWER, WAIT, parked_for_approval

from glia_client import (
    AsyncClient,
    AuthenticationError,
    Client,
    ConflictError,
    NotFoundError,
    UnprocessableEntityError,
    models,
)


def test_submit_and_get_the_answer(client: Client) -> None:
    run = client.submit("Say that the goal is met.", config=ANSWER, tags=["py-answer"])
    assert isinstance(run, models.RunSummary) and run.goal == "Say that the goal is met."
    done = client.wait(run.run_id, until="done", timeout=WAIT)
    assert done.status == "done" and done.outcome is not None
    assert (done.outcome.kind, done.outcome.answer) == ("succeeded", "Done: the goal is met.")
    assert done.tags == ["py-answer"] and done.ended_at is not None

    # The events: a page, and all of them, in order, ending with the outcome.
    events = list(client.iter_events(run.run_id))
    assert [e.seq for e in events] == list(range(1, done.head_seq + 1))
    assert events[0].type == "session.start" and events[-1].type == "session.complete"
    page = client.events(run.run_id, after=1, limit=2)
    assert [e.seq for e in page.events] == [2, 3] and page.next_after == 3
    # The stream of a finished run: from a seq, the rest; past its end, nothing.
    tail = [e.seq for e in client.stream(run.run_id, after=done.head_seq - 2)]
    assert tail == [done.head_seq - 1, done.head_seq]
    assert list(client.stream(run.run_id, after=done.head_seq)) == []

    # Listed by its tag.
    listed = client.list_runs(tags=["py-answer"], status="done", limit=10)
    assert run.run_id in [r.run_id for r in listed.runs]


def test_the_same_idempotency_key_gives_the_same_run(client: Client) -> None:
    key = f"py-{uuid.uuid4()}"
    first = client.submit("Once.", config=ANSWER, idempotency_key=key)
    again = client.submit("Once.", config=ANSWER, idempotency_key=key)
    assert again.run_id == first.run_id


@pytest.mark.anyio
async def test_the_async_client_submits_and_gets_the_answer(glia_url: str, token: str) -> None:
    async with AsyncClient(glia_url, token, max_outage=30) as glia:
        run = await glia.submit("Say it, asynchronously.", config=ANSWER)
        done = await glia.wait(run.run_id, until="done", timeout=WAIT)
        assert done.outcome is not None and done.outcome.answer == "Done: the goal is met."
        seqs = [e.seq async for e in glia.stream(run.run_id)]
        assert seqs == list(range(1, done.head_seq + 1))


def test_errors_carry_the_code_status_and_field(client: Client, glia_url: str) -> None:
    missing = uuid.uuid4()
    with pytest.raises(NotFoundError) as err:
        client.get_run(missing)
    assert (err.value.status, err.value.code) == (404, "run_not_found")
    assert str(missing) in err.value.message

    with pytest.raises(UnprocessableEntityError) as err:
        client.submit("Bad budget.", config={"model": "script:answer", "budget": {"max_turns": "ten"}})
    assert err.value.status == 422 and err.value.code == "invalid_body"
    assert err.value.field == "config.budget.max_turns", err.value

    with pytest.raises(UnprocessableEntityError) as err:
        client.submit("   ", config=ANSWER)
    assert err.value.field == "goal", err.value

    with Client(glia_url, "not-a-token", max_outage=5) as stranger:
        with pytest.raises(AuthenticationError) as auth:
            stranger.list_runs()
    assert (auth.value.status, auth.value.code) == (401, "invalid_token")


def test_another_tenant_cannot_see_the_run(client: Client, glia_url: str, token_other: str) -> None:
    run = client.submit("Acme's secret goal.", config=ANSWER)
    with Client(glia_url, token_other, max_outage=30) as other:
        with pytest.raises(NotFoundError) as err:
            other.get_run(run.run_id)
        assert err.value.code == "run_not_found"
        with pytest.raises(NotFoundError):
            other.events(run.run_id)
        with pytest.raises(NotFoundError):
            list(other.stream(run.run_id))
        with pytest.raises(NotFoundError):
            other.cancel(run.run_id)
        assert run.run_id not in [r.run_id for r in other.iter_runs()]
        # Its own run it sees.
        own = other.submit("Other's goal.", config=ANSWER)
        assert other.get_run(own.run_id).tenant == "other"
    client.wait(run.run_id, until="done", timeout=WAIT)


def test_cancel_a_waiting_run(client: Client) -> None:
    # Parked where only this test can release it (its refund waits for a
    # decision nobody makes), so the cancel always finds it waiting.
    run, _ = parked_for_approval(client, "Refund order A1 (cancel it).")
    accepted = client.cancel(run.run_id, reason="not needed")
    assert accepted is not None and accepted.kinds == ["cancel"] and accepted.run_id == run.run_id
    done = client.wait(run.run_id, until="done", timeout=WAIT)
    assert done.outcome is not None
    assert (done.outcome.kind, done.outcome.reason) == ("cancelled", "not needed")
    with pytest.raises(ConflictError) as err:
        client.cancel(run.run_id)
    assert err.value.code == "run_finished"
