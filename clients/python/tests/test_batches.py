"""A 200-item batch against the real fleet: submitted as JSON Lines with an
idempotency key, followed to the end over its progress stream, and every
item's result read back in submission order."""

from __future__ import annotations

import uuid

import pytest
from conftest import ANSWER

from glia_client import AsyncClient, Client, UnprocessableEntityError

ITEMS = 200


def test_a_200_item_batch_with_all_results(client: Client) -> None:
    key = f"py-batch-{uuid.uuid4()}"
    items = [
        {"custom_id": f"T-{i}", "goal": "Triage ticket {{ n }}.", "inputs": {"n": i}, "metadata": {"n": str(i)}}
        for i in range(ITEMS)
    ]
    batch = client.submit_batch(items, config=ANSWER, max_in_flight=50, idempotency_key=key)
    assert batch.total == ITEMS and batch.options.max_in_flight == 50
    # The same key answers the same batch.
    assert client.submit_batch(items, config=ANSWER, max_in_flight=50, idempotency_key=key).id == batch.id

    views = []
    for view in client.batch_progress(batch.id):
        views.append(view)
        if len(views) > 10_000:
            raise AssertionError("the progress stream does not end")
    final = views[-1]
    assert final.status == "completed", final
    assert final.counts.succeeded == ITEMS and final.counts.failed == 0
    done = [v.counts.succeeded for v in views]
    assert done == sorted(done), "progress never goes back"

    results = list(client.batch_results(batch.id))
    assert [r.custom_id for r in results] == [f"T-{i}" for i in range(ITEMS)]
    assert all(r.status == "succeeded" and r.answer == "Done: the goal is met." for r in results)
    assert [r.metadata for r in results] == [{"n": str(i)} for i in range(ITEMS)]
    assert len({r.run_id for r in results}) == ITEMS
    # Each item's run is an ordinary run of the batch, with its goal rendered.
    run = client.get_run(results[7].run_id)
    assert (run.batch_id, run.custom_id, run.goal) == (batch.id, "T-7", "Triage ticket 7.")


@pytest.mark.anyio
async def test_a_bad_item_refuses_the_batch_naming_its_line(glia_url: str, token: str) -> None:
    async with AsyncClient(glia_url, token, max_outage=30) as glia:
        with pytest.raises(UnprocessableEntityError) as err:
            await glia.submit_batch(
                [{"custom_id": "a", "goal": "fine"}, {"custom_id": "b", "goal": "bad", "tags": "not-a-list"}],
                config=ANSWER,
            )
        # The dispatcher's line (1 is the spec the client wrote) and the item.
        assert (err.value.line, err.value.item, err.value.field) == (3, 2, "tags"), err.value
        assert "(item 2) (line 3)" in str(err.value), str(err.value)
        small = await glia.submit_batch(
            [{"custom_id": "x", "goal": "One."}, {"custom_id": "y", "goal": "Two."}], config=ANSWER
        )
        final = await glia.wait_batch(small.id, timeout=120)
        assert final.status == "completed"
        results = [r async for r in glia.batch_results(small.id)]
        assert [(r.custom_id, r.status) for r in results] == [("x", "succeeded"), ("y", "succeeded")]
