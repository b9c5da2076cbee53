"""Approvals against the real fleet: the `refund` script's refund_order
call waits for a decision (a require_approval policy); approving with
edited arguments runs the edited call, rejecting runs nothing, and bulk
decisions answer per item. The demo refund tool appends one line per
refund to the effects file (its key names the run)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import WAIT, parked_for_approval, refunds_of

from glia_client import AsyncClient, Client, ConflictError, NotFoundError, WaitTimeout, models


def tool_outcome(client: Client, run_id: object, call_id: str) -> models.Event:
    """The tool.result or tool.error of ``call_id``."""
    for e in client.iter_events(run_id):  # type: ignore[arg-type]
        if e.type in ("tool.result", "tool.error") and e.data.get("call_id") == call_id:
            return e
    raise AssertionError(f"no outcome of call {call_id}")


def test_approve_with_edited_arguments_runs_the_edit(client: Client, effects_file: Path) -> None:
    run, row = parked_for_approval(client, "Refund order A1 (edit it to B7).")
    accepted = client.edit(run.run_id, row.call_id, {"order_id": "B7"}, args_hash=row.args_hash)
    assert accepted is not None and accepted.decision is not None
    assert accepted.decision.kind == "edit" and accepted.decision.input == {"order_id": "B7"}

    done = client.wait(run.run_id, after=run.head_seq, until="done", timeout=WAIT)
    assert done.outcome is not None and done.outcome.kind == "succeeded", done
    result = tool_outcome(client, run.run_id, row.call_id)
    assert result.type == "tool.result"
    assert '"order_id":"B7"' in json.dumps(result.data, separators=(",", ":")).replace("\\", ""), result.data
    [resolved] = [e for e in client.iter_events(run.run_id) if e.type == "approval.resolved"]
    assert resolved.data["decision"] == {"kind": "edit", "input": {"order_id": "B7"}}, resolved.data
    assert len(refunds_of(effects_file, run.run_id)) == 1, "the edited refund ran once"

    # The first decision won: another is refused with its code.
    with pytest.raises(ConflictError) as err:
        client.approve(run.run_id, row.call_id)
    assert err.value.code in ("already_decided", "run_finished")


def test_reject_runs_nothing(client: Client, effects_file: Path) -> None:
    run, row = parked_for_approval(client, "Refund order A1 (reject it).")
    accepted = client.reject(run.run_id, row.call_id, reason="not eligible")
    assert accepted is not None and accepted.decision is not None
    assert (accepted.decision.kind, accepted.decision.reason) == ("reject", "not eligible")
    done = client.wait(run.run_id, after=run.head_seq, until="done", timeout=WAIT)
    assert done.status == "done"
    outcome = tool_outcome(client, run.run_id, row.call_id)
    assert "not eligible" in json.dumps(outcome.data), outcome.data
    assert refunds_of(effects_file, run.run_id) == [], "a rejected refund never runs"


def test_a_stale_view_is_refused(client: Client) -> None:
    run, row = parked_for_approval(client, "Refund order A1 (stale view).")
    with pytest.raises(ConflictError) as err:
        client.approve(run.run_id, row.call_id, args_hash="0" * 64)
    assert err.value.code == "stale_args"
    with pytest.raises(NotFoundError) as missing:
        client.approve(run.run_id, "no-such-call")
    assert missing.value.code == "call_not_found"
    # Nothing answers it: waiting past the park gives up at the deadline, the run still parked.
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as waited:
        client.wait(run.run_id, after=run.head_seq, timeout=2)
    assert 2 <= time.monotonic() - started < 30
    assert waited.value.run.status == "parked" and waited.value.run.head_seq == run.head_seq
    client.reject(run.run_id, row.call_id, reason="cleanup")


@pytest.mark.anyio
async def test_a_wait_past_keep_alives_gives_up_at_its_deadline(client: Client, glia_url: str, token: str) -> None:
    # The dispatcher sends a keep-alive every 15 s while the run waits; they
    # are no events, so only the deadline itself can end these waits (before
    # the fix they followed the stream until the approval was decided).
    run, row = parked_for_approval(client, "Refund order A1 (a long wait).")
    started = time.monotonic()
    with pytest.raises(WaitTimeout):
        client.wait(run.run_id, after=run.head_seq, timeout=17)
    assert 17 <= time.monotonic() - started < 120
    async with AsyncClient(glia_url, token) as glia:
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as waited:
            await glia.wait(run.run_id, after=run.head_seq, timeout=17)
        assert 17 <= time.monotonic() - started < 120
    assert waited.value.run.status == "parked"
    client.reject(run.run_id, row.call_id, reason="cleanup")


@pytest.mark.anyio
async def test_bulk_decisions_answer_per_item(
    client: Client, glia_url: str, token: str, token_other: str, effects_file: Path
) -> None:
    first, row1 = parked_for_approval(client, "Refund order A1 (bulk 1).")
    second, row2 = parked_for_approval(client, "Refund order A1 (bulk 2).")
    async with AsyncClient(glia_url, token, max_outage=30) as glia:
        results = await glia.decide_many(
            [
                {"run_id": first.run_id, "call_id": row1.call_id, "decision": "approve"},
                {"run_id": second.run_id, "call_id": row2.call_id, "decision": "reject", "reason": "no"},
                {"run_id": second.run_id, "call_id": "no-such-call", "decision": "approve"},
            ]
        )
        statuses = [(r.status, r.error.code if r.error else None) for r in results.results]
        assert statuses == [(202, None), (202, None), (404, "call_not_found")], statuses
        for run in (first, second):
            done = await glia.wait(run.run_id, after=run.head_seq, until="done", timeout=WAIT)
            assert done.status == "done"
    assert len(refunds_of(effects_file, first.run_id)) == 1
    assert refunds_of(effects_file, second.run_id) == []
    # Another tenant cannot decide acme's approvals.
    third, row3 = parked_for_approval(client, "Refund order A1 (other tenant).")
    with Client(glia_url, token_other, max_outage=30) as other:
        with pytest.raises(NotFoundError):
            other.approve(third.run_id, row3.call_id)
        assert other.list_approvals().approvals == []
    client.reject(third.run_id, row3.call_id, reason="cleanup")
