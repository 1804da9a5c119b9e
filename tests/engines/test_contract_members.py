"""Every member of the engine contract has its conformance test: a new operation cannot
join the contract without one."""

from __future__ import annotations

import importlib
import pkgutil

import tests.engines
from tests.engines.conformance import contract_members


def _covered() -> dict[str, list[str]]:
    """Contract member -> the tests that declare they cover it (``@covers``)."""
    covered: dict[str, list[str]] = {}
    for info in pkgutil.iter_modules(tests.engines.__path__):
        if not info.name.startswith("test_contract_"):
            continue
        module = importlib.import_module(f"tests.engines.{info.name}")
        for name, test in vars(module).items():
            if name.startswith("test_") and callable(test):
                for member in getattr(test, "contract_members", ()):
                    covered.setdefault(member, []).append(f"{info.name}.{name}")
    return covered


def test_every_member_of_the_contract_has_a_conformance_test():
    missing = sorted(contract_members() - set(_covered()))
    assert missing == [], f"JobEngine members with no test in tests/engines/: {missing}"


def test_the_contract_lists_what_the_package_calls():
    # Not vacuous: the protocol has the operations the worker and dispatch use.
    assert {"claim_and_mark", "mark_succeeded", "insert_rows", "rescue"} <= contract_members()


def test_only_the_engines_reach_behind_the_contract():
    """``contract.behind()`` hands the engine's internals to modules of engines/ only."""
    import ast

    from tests.conftest import ROOT

    package = ROOT / "django_gator"
    outside = []
    for path in sorted(package.rglob("*.py")):
        if path.is_relative_to(package / "engines"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and any(a.name == "behind" for a in node.names):
                outside.append(str(path.relative_to(ROOT)))
    assert outside == []
