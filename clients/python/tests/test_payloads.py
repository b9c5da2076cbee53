"""Payloads other than decisions against the real fleet: a conversational
run's messages and close, and an external tool's result."""

from __future__ import annotations

import json

import pytest
from conftest import CHAT, EXTERNAL, TWO_ANSWERS, WAIT

from glia_client import ApiError, Client, ConflictError



def test_a_message_to_a_conversation(client: Client) -> None:
    run = client.submit("Hello.", config=TWO_ANSWERS)
    run = client.wait(run.run_id, timeout=WAIT)
    assert run.pull_point is not None and run.pull_point.kind == "awaiting_input", run
    accepted = client.send_message(run.run_id, "And one more thing.")
    assert accepted is not None and accepted.kinds == ["input"]
    # Another message against the head the first was sent at: refused,
    # whether or not a worker took the first yet (the run answers it and
    # waits for input again, so it is not finished either way).
    with pytest.raises(ConflictError) as err:
        client.send_message(run.run_id, "Again.", head_seq=run.head_seq)
    # Which refusal depends on where the worker is: the first still waiting
    # (already_posted), being answered (not_awaiting_input), or answered
    # (head_moved).
    assert err.value.code in ("already_posted", "not_awaiting_input", "head_moved")
    answered = client.wait(run.run_id, after=run.head_seq, timeout=WAIT)
    assert answered.pull_point is not None and answered.pull_point.kind == "awaiting_input", answered
    client.close_conversation(run.run_id)
    done = client.wait(run.run_id, after=answered.head_seq, until="done", timeout=WAIT)
    assert done.outcome is not None and done.outcome.answer == "Noted.", done
    texts = [e.data.get("text") for e in client.iter_events(run.run_id) if e.type == "input.received"]
    assert texts == ["And one more thing."], texts


def test_close_a_conversation(client: Client) -> None:
    run = client.submit("Hello, briefly.", config=CHAT)
    run = client.wait(run.run_id, timeout=WAIT)
    assert run.pull_point is not None and run.pull_point.kind == "awaiting_input", run
    closed = client.close_conversation(run.run_id)
    assert closed is not None and closed.kinds == ["close"]
    done = client.wait(run.run_id, after=run.head_seq, until="done", timeout=WAIT)
    assert done.outcome is not None
    assert (done.outcome.kind, done.outcome.answer) == ("succeeded", "Done: the goal is met.")


def test_an_external_tool_result(client: Client) -> None:
    run = client.submit("Look orders A1 and B2 up, outside.", config=EXTERNAL)
    run = client.wait(run.run_id, timeout=WAIT)
    assert run.pull_point is not None and run.pull_point.kind == "awaiting_tool", run
    [first] = run.pull_point.call_ids or []
    accepted = client.post_tool_result(run.run_id, first, {"order_id": "A1", "status": "delivered"})
    assert accepted is not None and accepted.call_id == first
    # A second result for the same call is refused: answered (409), or, once
    # a worker took the first and the run went on to B2, no longer pending (404).
    with pytest.raises(ApiError) as err:
        client.post_tool_result(run.run_id, first, "twice")
    assert err.value.code in ("already_answered", "call_not_found"), err.value
    waiting = client.wait(run.run_id, after=run.head_seq, timeout=WAIT)
    assert waiting.pull_point is not None and waiting.pull_point.kind == "awaiting_tool", waiting
    [second] = waiting.pull_point.call_ids or []
    assert second != first
    client.post_tool_result(waiting.run_id, second, {"order_id": "B2", "status": "shipped"})
    done = client.wait(run.run_id, after=waiting.head_seq, until="done", timeout=WAIT)
    assert done.outcome is not None and done.outcome.answer == "Looked up."
    results = {e.data.get("call_id"): json.dumps(e.data) for e in client.iter_events(run.run_id) if e.type == "tool.result"}
    assert "delivered" in results[first] and "shipped" in results[second], results
