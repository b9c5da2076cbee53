"""The event stream across forced disconnects: a real TCP proxy between the
client and the dispatcher cuts the first connections mid-stream; the client
reconnects with Last-Event-ID and yields every event exactly once, in
order."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from conftest import SLOW, WAIT
from proxy import CuttingProxy

from glia_client import AsyncClient, Client, models


@pytest.fixture
def proxy(glia_url: str) -> Iterator[CuttingProxy]:
    parts = urlsplit(glia_url)
    p = CuttingProxy((parts.hostname or "127.0.0.1", parts.port or 80), cuts=3, frames=2)
    yield p
    p.close()


def check(proxy: CuttingProxy, seqs: list[int], events: list[models.Event]) -> None:
    """Every event once, in order, ending with the outcome; each reconnect
    asked for the events after the last one relayed whole."""
    assert seqs == [e.seq for e in events], "the stream's events are the log's"
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    assert events[-1].type == "session.complete"
    cut = [c for c in proxy.connections if c.cut]
    assert len(cut) == 3, [vars(c) for c in proxy.connections]
    assert "last-event-id" not in proxy.connections[0].request_headers
    delivered = 0
    for i, conn in enumerate(proxy.connections):
        if i > 0:
            assert conn.request_headers.get("last-event-id") == str(delivered), (i, vars(conn))
        delivered = max([delivered, *conn.relayed_ids])


def test_a_stream_cut_mid_way_resumes_with_last_event_id(client: Client, proxy: CuttingProxy, token: str) -> None:
    run = client.submit("Sleep, then answer.", config=SLOW)
    with Client(proxy.url, token, max_outage=30) as through:
        seqs = [e.seq for e in through.stream(run.run_id) if isinstance(e, models.Event)]
    check(proxy, seqs, list(client.iter_events(run.run_id)))


@pytest.mark.anyio
async def test_the_async_stream_resumes_alike(client: Client, proxy: CuttingProxy, token: str) -> None:
    run = client.submit("Sleep, then answer, asynchronously.", config=SLOW)
    async with AsyncClient(proxy.url, token, max_outage=30) as through:
        seqs = [e.seq async for e in through.stream(run.run_id) if isinstance(e, models.Event)]
    check(proxy, seqs, list(client.iter_events(run.run_id)))


def test_wait_follows_the_stream_through_cuts(client: Client, proxy: CuttingProxy, token: str) -> None:
    run = client.submit("Sleep, then answer; wait for it.", config=SLOW)
    with Client(proxy.url, token, max_outage=30) as through:
        done = through.wait(run.run_id, until="done", timeout=WAIT)
    assert done.outcome is not None and done.outcome.answer == "Waited."
