"""The shared core's state, without I/O: an event stream's frames across a
reconnect (replays dropped, order kept), what ``wait`` counts as arrived,
and how long the retry rule waits."""

from __future__ import annotations

import json
import uuid

import pytest

from glia_client import StreamError, UnreachableError, models
from glia_client._core import EventFollow, Outage, Settings, StreamBroken, WaitPlan, batch_item
from glia_client.errors import api_error

RUN = str(uuid.uuid4())


def frame(seq: int, kind: str = "step.start") -> str:
    return json.dumps({"run_id": RUN, "seq": seq, "at": "2026-12-07T10:00:00Z", "type": kind, "data": {}})


def follow(after: int = 0, live: bool = False) -> EventFollow:
    return EventFollow(RUN, after, Outage(Settings("http://glia", None, max_outage=5)), include_live=live)


def test_a_resumed_stream_drops_what_was_yielded_and_asks_after_it() -> None:
    f = follow()
    assert "Last-Event-ID" not in f.call().headers
    seen = [f.on_frame("event", frame(n)) for n in (1, 2)]
    assert [e.seq for e in seen if e] == [1, 2]
    assert f.call().headers["Last-Event-ID"] == "2"
    # The next connection replays 2 (a proxy's buffer), then goes on.
    again = [f.on_frame("event", frame(n)) for n in (2, 3)]
    assert [e.seq if e else None for e in again] == [None, 3]
    assert not f.finished
    assert f.on_frame("event", frame(4, "session.complete")) is not None and f.finished


def test_keepalives_live_deltas_and_error_frames() -> None:
    f = follow()
    assert f.on_frame("message", "") is None
    delta = json.dumps({"type": "model.delta", "data": {"text": "he"}})
    assert f.on_frame("live", delta) is None, "live deltas only when asked for"
    assert isinstance(follow(live=True).on_frame("live", delta), models.LiveEvent)
    with pytest.raises(StreamBroken):
        f.on_frame("error", '{"error": {"code": "log_unavailable"}}')
    with pytest.raises(StreamError):
        f.on_frame("event", '{"seq": "one"}')


def run_view(status: str, head: int, parked_at: str | None = "awaiting_approval") -> models.RunSummary:
    extra = {"pull_point": {"kind": parked_at, "call_ids": []}} if status == "parked" and parked_at else {}
    return models.RunSummary.model_validate(
        {
            **extra,
            "run_id": RUN, "tenant": "acme", "goal": "g", "status": status, "phase": "idle",
            "head_seq": head, "created_at": "2026-12-07T10:00:00Z", "updated_at": "2026-12-07T10:00:00Z",
            "tags": [], "metadata": {}, "steps": 0, "trace_id": "0" * 32,
            "usage": {"turns": 0, "tool_calls": 0, "active_ms": 0, "tokens": {"input_tokens": 0, "output_tokens": 0}, "cost_usd_micros": 0},
        }
    )


def test_what_a_wait_counts_as_arrived() -> None:
    now = WaitPlan(RUN, None, "pull_point", None)
    assert now.satisfied(run_view("parked", 5)) and now.satisfied(run_view("done", 9))
    assert not now.satisfied(run_view("runnable", 5))
    # After a decision: the park the caller saw (head 5) does not count.
    after = WaitPlan(RUN, 5, "pull_point", None)
    assert not after.satisfied(run_view("parked", 5))
    assert after.satisfied(run_view("parked", 9)) and after.satisfied(run_view("done", 5))
    assert after.follow(run_view("runnable", 7), Settings("http://glia", None)).last == 7
    done = WaitPlan(RUN, None, "done", None)
    assert not done.satisfied(run_view("parked", 5)) and done.satisfied(run_view("done", 5))
    with pytest.raises(ValueError):
        WaitPlan(RUN, None, "parked", None)


def test_a_wait_returns_at_pull_points_a_caller_answers() -> None:
    answerable = WaitPlan(RUN, None, "pull_point", None)
    for kind in ("awaiting_approval", "awaiting_tool", "awaiting_input", "paused"):
        assert answerable.satisfied(run_view("parked", 5, kind)), kind
    # A timer, a delayed start, children: the run goes on by itself.
    for kind in ("awaiting_timer", "awaiting_children"):
        assert not answerable.satisfied(run_view("parked", 5, kind)), kind
    timers = WaitPlan(RUN, None, "pull_point", None, frozenset({"awaiting_timer"}))
    assert timers.satisfied(run_view("parked", 5, "awaiting_timer"))
    assert not timers.satisfied(run_view("parked", 5, "awaiting_approval"))
    with pytest.raises(ValueError):
        WaitPlan(RUN, None, "pull_point", None, "awaiting_timer")  # type: ignore[arg-type]


def test_a_batch_error_names_the_item_and_keeps_the_line() -> None:
    body = json.dumps({"error": {"code": "invalid_body", "message": "bad", "field": "tags", "line": 3}}).encode()
    err = batch_item(api_error(422, body, method="POST", path="/v1/batches"))
    assert (err.line, err.item) == (3, 2)
    assert str(err) == "POST /v1/batches: 422 invalid_body (item 2) (line 3) (field tags): bad"
    spec = batch_item(api_error(422, body.replace(b'"line": 3', b'"line": 1'), method="POST", path="/v1/batches"))
    assert (spec.line, spec.item) == (1, None) and "item" not in str(spec)


def test_the_backoff_grows_to_three_seconds_and_honours_retry_after() -> None:
    outage = Outage(Settings("http://glia", None, max_outage=1000))
    delays = []
    for _ in range(8):
        outage.attempts += 1
        delays.append(outage.failed("503: starting", None))
    assert 0.2 <= delays[0] <= 0.4 and all(3.0 <= d <= 6.0 for d in delays[5:]), delays
    outage.attempts += 1
    assert outage.failed("503", 9.0) >= 9.0
    spent = Outage(Settings("http://glia", None, max_outage=0))
    with pytest.raises(UnreachableError):
        spent.failed("503", None)
