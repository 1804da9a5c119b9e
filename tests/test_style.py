"""Ratchets on how the tests themselves are written."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

#: Tests that synchronise by sleeping: a ``time.sleep(...)`` outside any loop (a poll with
#: a deadline loops) and not marked as a deliberate passage of time by a trailing
#: ``# deliberate:`` comment, as "module:function". Wait for an event or a condition
#: instead (tests.conftest.wait_for). The list may only shrink.
SLEEPING_TESTS: set[str] = set()


def _bare_sleeps(source: str) -> list[tuple[int, str]]:
    """(line, enclosing function) of each ``time.sleep(...)`` call in ``source`` that is
    neither inside a ``for``/``while`` nor marked ``# deliberate:`` on its lines."""
    lines = source.splitlines()
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str, in_loop: bool) -> None:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "sleep"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "time"
            and not in_loop
        ):
            end = node.end_lineno or node.lineno
            if not any("# deliberate:" in line for line in lines[node.lineno - 1 : end]):
                found.append((node.lineno, function))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and function == "":
            function = node.name
        loop = isinstance(node, ast.For | ast.AsyncFor | ast.While)
        for child in ast.iter_child_nodes(node):
            visit(child, function, in_loop or loop)

    visit(ast.parse(source), "", False)
    return found


def test_no_test_synchronises_by_sleeping():
    sleeping = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for line, function in _bare_sleeps(path.read_text()):
            sleeping[f"{relative}:{function}"] = line
    found = set(sleeping)
    assert found - SLEEPING_TESTS == set(), (
        f"wait for an event or a condition, not a time ({sleeping}); a passage of time "
        "that is what the test is about says so with a trailing '# deliberate:' comment"
    )
    assert SLEEPING_TESTS - found == set(), "no longer sleeping: take them off SLEEPING_TESTS"


SAMPLE = """
def test_sample(ready):
    time.sleep(0.3)
    while not ready():
        time.sleep(0.05)
    for _ in range(3):
        time.sleep(0.1)
    time.sleep(2)  # deliberate: nothing may happen within two seconds

def helper():
    time.sleep(
        1,
    )  # deliberate: on the call's last line
"""


def test_the_sleep_check_sees_bare_sleeps_only():
    assert _bare_sleeps(SAMPLE) == [(3, "test_sample")]


def test_the_database_free_modules_exist():
    """tests/conftest.py marks the database-free tests of the modules it lists: a module
    renamed away from the list would silently run on every database again."""
    from tests.conftest import DATABASE_FREE_MODULES

    assert [m for m in sorted(DATABASE_FREE_MODULES) if not (ROOT / m).is_file()] == []
