"""The README's first example (the ten lines that submit a goal and print
the answer) runs against the fleet as written, with the fleet's address,
token and scripted model put in."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def example(title: str) -> str:
    text = README.read_text()
    section = text[text.index(f"## {title}") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no Python example under {title!r}"
    return match.group(1)


def test_the_submit_and_print_example_runs(glia_url: str, token: str) -> None:
    code = example("Submit a goal and print the answer")
    assert len(code.strip().splitlines()) <= 10, "the example is ten lines at most"
    code = code.replace('"http://127.0.0.1:8080"', repr(glia_url))
    code = code.replace('"tok-acme"', repr(token)).replace('"claude-sonnet-4-5"', '"script:answer"')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {})
    assert out.getvalue() == "Done: the goal is met.\n"
