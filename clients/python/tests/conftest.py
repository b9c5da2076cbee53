"""Fixtures of the client's suite.

The fleet tests run against a real dispatcher and worker that
``tests/fleet/clients/python.rs`` starts (``cargo test -p glia-e2e --test
fleet clients::python``), which sets ``GLIA_URL``, ``GLIA_TOKEN`` (tenant
``acme``, admin), ``GLIA_TOKEN_OTHER`` (tenant ``other``) and
``GLIA_EFFECTS_FILE`` (one line per refund the demo tool made). Without
them those tests are skipped, loudly; the tests that need no fleet (model
freshness, endpoints, webhook signatures, retries against a stand-in
server) always run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from glia_client import Client, models

ANSWER = {"model": "script:answer"}
"""A run that answers at once: `Done: the goal is met.`"""

REFUND = {
    "model": "script:refund",
    "policies": [{"tool": "refund_order", "action": {"kind": "require_approval"}}],
}
"""A run that looks order A1 up and refunds it, the refund waiting for a decision."""

SLOW = {"model": "script:slow", "builtin_tools": ["sleep"]}
"""A run that sleeps 2 s (a built-in timer) before it answers."""

CHAT = {"model": "script:answer", "conversational": True}
TWO_ANSWERS = {"model": "script:chat", "conversational": True}
EXTERNAL = {
    "model": "script:lookup",
    "external_tools": [
        {"name": "lookup_order", "description": "Look an order up (the caller's system).",
         "input_schema": {"type": "object"}, "external": True}
    ],
}
"""Conversational runs (one answer, or two: the second to one message) and
a run that looks orders A1 and B2 up with an external tool the caller answers."""

WAIT = 120.0
"""Seconds a test waits for a run at most (a busy 2-core machine)."""


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.skip(
            f"!!! {name} is not set: this test needs the fleet that "
            "`cargo test -p glia-e2e --test fleet clients::python` starts"
        )
    return value


@pytest.fixture
def glia_url() -> str:
    """The fleet dispatcher's base URL."""
    return _env("GLIA_URL")


@pytest.fixture
def token() -> str:
    """Tenant acme's admin token."""
    return _env("GLIA_TOKEN")


@pytest.fixture
def token_other() -> str:
    """Tenant other's token (submit, approve)."""
    return _env("GLIA_TOKEN_OTHER")


@pytest.fixture
def effects_file() -> Path:
    """The demo refund tool's effects file."""
    return Path(_env("GLIA_EFFECTS_FILE"))


@pytest.fixture
def client(glia_url: str, token: str) -> Iterator[Client]:
    """A blocking client of tenant acme."""
    with Client(glia_url, token, max_outage=30) as c:
        yield c


@pytest.fixture
def anyio_backend() -> str:
    """The async tests run on asyncio (anyio's pytest plugin)."""
    return "asyncio"


def refunds_of(effects_file: Path, run_id: object) -> list[str]:
    """The effects file's lines for run ``run_id`` (keys are
    ``{run_id}:{turn}:{call_id}``)."""
    if not effects_file.exists():
        return []
    return [line for line in effects_file.read_text().splitlines() if f" {run_id}:" in line]


def parked_for_approval(client: Client, goal: str) -> tuple[models.RunSummary, models.ApprovalRow]:
    """A ``REFUND`` run parked for its refund's approval, and the approval
    (order A1)."""
    run = client.submit(goal, config=REFUND)
    run = client.wait(run.run_id, timeout=WAIT)
    assert run.status == "parked" and run.pull_point is not None, run
    assert run.pull_point.kind == "awaiting_approval", run.pull_point
    [row] = client.list_approvals(run_id=run.run_id).approvals
    assert row.tool == "refund_order" and row.input == {"order_id": "A1"}
    assert row.call_id in (run.pull_point.call_ids or [])
    return run, row


def parked_for_input(client: Client, goal: str, config: dict[str, object]) -> models.RunSummary:
    """A conversational run parked at ``awaiting_input``."""
    run = client.submit(goal, config=config)
    run = client.wait(run.run_id, timeout=WAIT)
    assert run.pull_point is not None and run.pull_point.kind == "awaiting_input", run
    return run
