"""The documentation's code examples run: every ```python block of the site (docs/) and of the
README is marked
``<!-- runnable -->`` or ``<!-- fragment -->`` on the line before it, and each runnable one
is executed here, in the test project, the blocks of a page one after another in one
namespace (as a reader would paste them), with the database of the test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from django_gator import registry

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARKERS = ("<!-- runnable -->", "<!-- fragment -->")
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number, marker or "", code) of every ```python block of a page."""
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        line = text.count("\n", 0, match.start()) + 1
        blocks.append((line, before if before in MARKERS else "", match.group(1)))
    return blocks


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def runnable_pages() -> list[Path]:
    return [
        page
        for page in pages()
        if any(marker == MARKERS[0] for _, marker, _ in python_blocks(page.read_text()))
    ]


def test_every_python_block_of_the_docs_says_whether_it_runs():
    unmarked = [
        f"{page.relative_to(ROOT)}:{line}"
        for page in pages()
        for line, marker, _ in python_blocks(page.read_text())
        if not marker
    ]
    assert unmarked == [], (
        "python blocks without <!-- runnable --> or <!-- fragment --> on the line before: "
        f"{unmarked}"
    )


def test_the_block_finder_sees_markers_and_blocks():
    text = "x\n<!-- runnable -->\n```python\na = 1\n```\n\n```python\nb\n```\n"
    assert python_blocks(text) == [(3, MARKERS[0], "a = 1\n"), (7, "", "b\n")]
    assert len(runnable_pages()) >= 3


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_runnable_examples_of_a_page_run(page, db, settings):
    settings.GATOR_IMMEDIATE = False
    module = "docs_examples." + re.sub(r"\W", "_", str(page.relative_to(ROOT))[:-3])
    namespace: dict[str, object] = {"__name__": module}
    before = set(registry.registered_jobs())
    try:
        for line, marker, code in python_blocks(page.read_text()):
            if marker != MARKERS[0]:
                continue
            compiled = compile(code, f"{page.relative_to(ROOT)}:{line}", "exec")
            exec(compiled, namespace)  # the documentation's own examples
    finally:
        for name in set(registry.registered_jobs()) - before:
            registry.unregister(name)
