"""Agents apply against the real fleet: a definition becomes a version,
applying it again changes nothing, new content is the next version, and a
run admitted with the agent's name runs it."""

from __future__ import annotations

import uuid

import pytest
from conftest import WAIT

from glia_client import Client, NotFoundError, UnprocessableEntityError, models


def test_apply_an_agent_and_run_it(client: Client) -> None:
    name = f"py-{uuid.uuid4().hex[:12]}"
    definition = {"name": name, "description": "Answers at once.", "model": "script:answer"}
    first = client.apply_agent(definition)
    assert first.created and first.agent.version == 1 and first.agent.content_hash.startswith("sha256:")
    again = client.apply_agent(models.AgentDefinition(**definition))
    assert not again.created and again.agent.version == 1
    [second] = client.apply_agents([{**definition, "description": "Answers at once, still."}])
    assert second.created and second.agent.version == 2
    assert client.get_agent(name).version == 2
    assert client.get_agent(name, version=1).definition.description == "Answers at once."
    assert name in [a.name for a in client.list_agents().agents]

    run = client.submit("Run the agent.", agent=f"{name}@1")
    done = client.wait(run.run_id, until="done", timeout=WAIT)
    assert (done.agent, done.agent_version) == (name, 1)
    assert done.outcome is not None and done.outcome.answer == "Done: the goal is met."

    with pytest.raises(NotFoundError) as err:
        client.submit("No such agent.", agent=f"{name}-missing")
    assert err.value.code == "agent_not_found"
    with pytest.raises(UnprocessableEntityError) as bad:
        client.apply_agent({"name": name, "model": "script:answer", "budget": {"max_turns": -1}})
    assert bad.value.field is not None and bad.value.field.startswith("budget"), bad.value
    with pytest.raises(ValueError, match="two definitions"):
        client.apply_agents([definition, definition])
