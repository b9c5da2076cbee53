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

from glia_client import _endpoints, _ops

HERE = Path(__file__).resolve().parent.parent
DOCUMENT = HERE.parent.parent / "schemas" / "openapi.json"
MODELS = HERE / "src" / "glia_client" / "models.py"


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
