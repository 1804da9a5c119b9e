"""What installing takes: the demo needs only Python (no database driver to compile, no
system package, no root), and the demo extra covers what the demo project imports. The
wheel itself is built, checked and run by `make package-check` (scripts/package-check.sh)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
@pytest.mark.parametrize("target", ["demo", "demo-check"])
def test_the_demo_installs_only_what_sqlite_needs(tmp_path: Path, target: str) -> None:
    # `make demo` used to install the mysql extra into the test venv: mysqlclient needs the
    # MariaDB headers, which the Makefile installed with apt-get as root, or failed.
    proc = subprocess.run(
        ["make", "--dry-run", target, f"DEMO_VENV={tmp_path / 'venv'}", f"VENV={tmp_path / 'x'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )

    commands = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert f"{tmp_path / 'venv'}/bin/python -m pip install" in commands
    assert "-e '.[demo]'" in commands
    for needed_root_or_headers in ("apt-get", "pkg-config", "mysql", "postgres", ".[dev"):
        assert needed_root_or_headers not in commands
    assert str(tmp_path / "x") not in commands  # the test venv is not built for the demo


def _third_party_imports(paths: list[Path]) -> set[str]:
    local = {"demo", "testproject", "django_gator"}
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in local:
                    found.add(top)
    return found


def test_the_demo_extra_covers_what_the_demo_project_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["demo"]
    installed = {r.split(">")[0].split("<")[0].split("=")[0].strip().lower() for r in requirements}
    import_names = {"django": "django", "croniter": "croniter", "environ": "django-environ"}

    imported = _third_party_imports(sorted((ROOT / "testproject").rglob("*.py")))

    assert imported  # the scan sees Django at least
    missing = {name for name in imported if import_names.get(name, name) not in installed}
    assert not missing, f"testproject imports {missing}, which the demo venv does not install"
