"""docs/security.md backs each claim with the test that checks it: every test it names exists, so a
renamed or removed test cannot leave a claim standing unchecked."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# `tests/a/test_b.py::test_c[param]`, and the `::test_d` that follow it in the same table cell.
CELL_REFS = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?(?:\[[^\]`]*\])?`|`::(\w+)(?:\[[^\]`]*\])?`")


def named_tests(doc: Path) -> list[tuple[str, str | None]]:
    """(test file, test function or None) of every reference in `doc`, in order."""
    refs: list[tuple[str, str | None]] = []
    for line in doc.read_text().splitlines():
        current = None
        for path, name, bare in CELL_REFS.findall(line):
            if path:
                current = path
                refs.append((path, name or None))
            elif current is not None:
                refs.append((current, bare))
    return refs


def functions(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.mark.parametrize("doc", ["docs/security.md"])
def test_every_test_a_doc_names_exists(doc: str) -> None:
    refs = named_tests(REPO / doc)
    assert len(refs) > 30, "the claims' tests are no longer found in the document"
    missing = [f"{path}::{name}" if name else path for path, name in refs
               if not (REPO / path).is_file() or (name is not None and name not in functions(REPO / path))]
    assert not missing, f"{doc} names tests that do not exist: {missing}"


# The design the repository follows is docs/design.md; no file leans on one outside it, on a
# tracker's numbers or on a folder of one machine. docs/benchmarks.md is left out: its history is
# rewritten as a whole.
OUTSIDE = re.compile("|".join((r"ARCHITECTURE\.md", r"shared[/]design", r"\bissues? #?\d+", r"\bIssue \d+", r"(?<![\w.])/wor[k]/")))
TEXT = (".py", ".md", ".yaml", ".yml", ".toml", ".c", ".h", ".html", ".txt", "Makefile", "Dockerfile")


def test_the_repository_points_nowhere_outside_itself() -> None:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    files = [REPO / name for name in listed if name.endswith(TEXT) and name != "docs/benchmarks.md" and (REPO / name).is_file()]
    assert len(files) > 100
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}" for path in files
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not found, "\n".join(found)
