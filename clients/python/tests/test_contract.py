"""The client and the OpenAPI document (``schemas/openapi.json``, which a
Rust test keeps equal to what the dispatcher serves) agree: the typed models
are exactly what the generator makes of the document, and every operation
the client calls is in it."""

from __future__ import annotations

import difflib
import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, ValidationError

from glia_client import _endpoints, _ops, models
from glia_client._core import _NO_BODY

HERE = Path(__file__).resolve().parent.parent
DOCUMENT = HERE.parent.parent / "schemas" / "openapi.json"
MODELS = HERE / "src" / "glia_client" / "models.py"
RUN_ID = "6f1c1a52-0000-4000-8000-000000000002"


def test_models_are_generated_from_the_document(tmp_path: Path) -> None:
    codegen = Path(sys.executable).parent / "datamodel-codegen"
    assert codegen.exists(), f"datamodel-codegen is not in the test venv ({codegen})"
    # The generator reads its options from pyproject.toml in the working
    # directory: the same options the committed module was made with.
    shutil.copy(HERE / "pyproject.toml", tmp_path / "pyproject.toml")
    out = tmp_path / "models.py"
    done = subprocess.run(
        [str(codegen), "--input", str(DOCUMENT), "--output", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"datamodel-codegen failed:\n{done.stderr}"
    fresh = out.read_text()
    committed = MODELS.read_text()
    if fresh != committed:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    fresh.splitlines(keepends=True),
                    "committed models.py",
                    "generated from schemas/openapi.json",
                )
            )[:80]
        )
        raise AssertionError(
            "clients/python/src/glia_client/models.py differs from what schemas/openapi.json "
            "generates: regenerate it with `cd clients/python && "
            "../../.ci/clients-venv/bin/datamodel-codegen` (after `cargo run -p glia-cli -- "
            f"schemas` when the API changed) and commit it.\n{diff}"
        )


def test_every_endpoint_the_client_calls_is_in_the_document() -> None:
    paths = json.loads(DOCUMENT.read_text())["paths"]
    assert _endpoints.ALL, "no endpoints"
    for e in _endpoints.ALL:
        assert e.path in paths, f"{e.method} {e.path} is not a path of schemas/openapi.json"
        operation = paths[e.path].get(e.method.lower())
        assert operation is not None, f"{e.method} {e.path} is not in schemas/openapi.json"
        documented = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
        used = set(re.findall(r"\{(\w+)\}", e.path))
        assert used == documented, f"{e.method} {e.path}: path parameters {used} vs {documented}"


def test_every_operation_is_built_from_a_listed_endpoint() -> None:
    """``_ops`` builds every request; each names an endpoint of ``ALL``
    (so the check above covers everything the client sends)."""
    source = inspect.getsource(_ops)
    named = set(re.findall(r"\bep\.([A-Z_]+)\b", source))
    listed = {name for name, v in vars(_endpoints).items() if v in _endpoints.ALL}
    assert named, "no endpoint used"
    assert named <= listed, f"endpoints used but not listed: {named - listed}"


def test_query_parameters_are_documented() -> None:
    """The query parameters the client sends exist on their operation."""
    paths = json.loads(DOCUMENT.read_text())["paths"]
    calls = [
        _ops.list_runs(
            status="done",
            outcome="succeeded",
            agent="a",
            version=1,
            batch_id="b",
            tags=["t"],
            metadata={"k": "v"},
            since="2026-01-01T00:00:00Z",
            until="2026-01-02T00:00:00Z",
            error="e",
            tenant="acme",
            parent="p",
            limit=5,
            cursor="c",
        ),
        _ops.events("r", 3, 10),
        _ops.list_approvals(run_id="r", tool="t", status="all", limit=5),
        _ops.list_batches("b", 5),
    ]
    for call in calls:
        operation = paths[call.endpoint.path][call.endpoint.method.lower()]
        documented = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
        sent = {name for name, _ in call.query}
        assert sent <= documented, f"{call.endpoint.path}: {sent - documented} not documented"


def extra_fields(value: object, where: str = "") -> list[str]:
    """Where a validated model (and the models in it) kept fields its
    schema does not declare (``model_extra``: the models accept unknown
    fields, so a body field the document renamed lands there)."""
    found: list[str] = []
    if isinstance(value, BaseModel):
        found += [f"{where}.{k}".lstrip(".") for k in (value.model_extra or {})]
        for name in type(value).model_fields:
            found += extra_fields(getattr(value, name), f"{where}.{name}")
        root = getattr(value, "root", None)
        if root is not None and "root" not in type(value).model_fields:
            found += extra_fields(root, where)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found += extra_fields(v, f"{where}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            found += extra_fields(v, f"{where}.{k}")
    return found


def request_model(path: str, method: str, content_type: str = "application/json") -> type[BaseModel]:
    """The generated model of an operation's request body, by the
    document's ``$ref``."""
    paths = json.loads(DOCUMENT.read_text())["paths"]
    ref = paths[path][method.lower()]["requestBody"]["content"][content_type]["schema"]["$ref"]
    return getattr(models, ref.rsplit("/", 1)[1])  # type: ignore[no-any-return]


def conforms(model: type[BaseModel], body: object) -> None:
    """``body`` is valid for ``model`` and uses no field it lacks."""
    try:
        parsed = model.model_validate(body)
    except ValidationError as e:
        raise AssertionError(f"{model.__name__} refuses the body the client builds {body}: {e}") from e
    extra = extra_fields(parsed)
    assert not extra, f"{model.__name__}: the client sends fields the document lacks: {extra}"


def test_request_bodies_match_the_document() -> None:
    """Every JSON body the client builds, with every optional field set,
    validates against its operation's request schema in the document and
    uses only fields the schema declares (a renamed field fails here)."""
    calls = [
        _ops.submit(
            "g", config={"model": "m", "budget": {"max_turns": 3}}, agent=None,
            batch_id="6f1c1a52-0000-4000-8000-000000000001",
            tags=["t"], metadata={"k": "v"}, start_at="2026-01-01T00:00:00Z", idempotency_key="k",
        ),
        _ops.submit(
            "g", config=None, agent="support@2", batch_id=None, tags=None, metadata=None,
            start_at=None, idempotency_key=None,
        ),
        _ops.decide("r", "c", "approve", args_hash="0" * 64),
        _ops.decide("r", "c", "reject", reason="no", args_hash="0" * 64),
        _ops.decide("r", "c", "edit", input={"order_id": "B7"}, args_hash="0" * 64),
        _ops.decide_many(
            [
                {"run_id": RUN_ID, "call_id": "c", "decision": "reject", "reason": "no", "args_hash": "0" * 64},
                {"run_id": RUN_ID, "call_id": "d", "decision": "edit", "input": {"a": 1}},
            ]
        ),
        _ops.tool_result("r", "c", {"status": "ok"}, True),
        _ops.message("r", "hello", 7),
        _ops.close("r", "bye", 7),
        _ops.close("r", None, 7),
        _ops.cancel("r", "not needed"),
        _ops.pause("r", "hold"),
        _ops.resume("r", {"max_turns": 10, "max_cost_usd_micros": 5}),
        _ops.apply_agent({"name": "support", "model": "m", "system": "Be kind."}),
        _ops.batch_control("b", "resume", {"spend_cap": {"usd_micros": 5}}),
        _ops.create_webhook("https://hooks.example.com/x", ["run.completed"], "standard"),
    ]
    for call in calls:
        assert call.json is not _NO_BODY, call.endpoint
        conforms(request_model(call.endpoint.path, call.endpoint.method), call.json)

    # A batch upload: line 1 the spec, then one item per line.
    batch = _ops.submit_batch(
        [{"custom_id": "a", "goal": "g", "inputs": {"n": 1}, "metadata": {"k": "v"}, "tags": ["t"]}],
        config={"model": "m"}, agent=None, max_in_flight=5, spend_cap={"usd_micros": 9},
        completion_window_secs=3600, idempotency_key=None,
    )
    spec, item = (json.loads(line) for line in (batch.content or b"").splitlines())
    conforms(models.BatchSpec, spec)
    conforms(models.BatchItem, item)
