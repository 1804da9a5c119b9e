"""The package's layers (.importlinter): what importing a module loads, and the wiring that
lets dispatch and the engines call the worker's code without importing it."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings

import django_gator
from django_gator import immediate
from django_gator.engines import core as engines
from django_gator.engines import get_engine
from django_gator.models import Job, JobState, record
from django_gator.worker import connections, inline
from tests.conftest import ROOT
from tests.factories import JobFactory
from tests.testapp.jobs import Noop

#: Modules that need Django's apps to be ready, or that are the worker's machinery.
HEAVY = (
    "django_gator.models",
    "django_gator.dispatch",
    "django_gator.pipeline",
    "django_gator.engines",
    "django_gator.worker",
)


def _loaded_after(code: str) -> list[str]:
    """The django_gator modules a fresh interpreter has loaded after running ``code``, with
    no Django settings configured (as in a settings module that imports django_gator)."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [m for m in json.loads(out) if m.startswith("django_gator")]


def test_importing_the_package_loads_no_models_engines_dispatch_or_worker():
    loaded = _loaded_after("import django_gator")
    assert "django_gator.queueable" in loaded
    assert [m for m in loaded if m.startswith(HEAVY)] == []


def test_the_app_installs_the_workers_code_where_dispatch_and_the_engines_call_it():
    assert immediate._inline_runner is inline.run_inline
    assert immediate._inline_worker_id is inline.inline_worker_id
    assert engines._connection_hook is connections.bound_connection


@pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_the_listen_connection_of_a_worker_process_is_bounded_through_the_hook():
    # The engine opens the LISTEN connection itself, outside Django; the worker's bounds
    # reach it only through the hook the app installed.
    undo = connections.prepare()
    try:
        assert connections._bounds is not None
        with get_engine("default").listen() as listener:
            raw = listener.connection
            assert raw._gator_network_bounds == connections._bounds
            with raw.cursor() as cursor:
                cursor.execute("SHOW tcp_user_timeout")
                assert cursor.fetchone()[0] == str(connections._bounds.user_timeout_ms)
    finally:
        undo()


@pytest.mark.django_db
def test_immediate_mode_without_the_apps_runner_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(immediate, "_inline_runner", None)
    with (
        override_settings(GATOR_IMMEDIATE=True),
        pytest.raises(ImproperlyConfigured, match="'django_gator' in INSTALLED_APPS"),
    ):
        Noop.dispatch()
    # The row was written before the run was attempted; it waits for a worker.
    assert Job.objects.get().state == JobState.WAITING


@pytest.mark.django_db
def test_the_audit_trail_appends_in_order_across_batches():
    many = JobFactory.create_batch(1001, dead=True)
    ids = [job.pk for job in many]
    Job.objects.filter(pk=ids[0]).update(audit=[{"action": "older"}])
    record(None, ids, "retry", "zoë", queue="recovery", note=None)
    record(None, ids[:1], "discard", "op")

    first = Job.objects.get(pk=ids[0])
    assert [e["action"] for e in first.audit] == ["older", "retry", "discard"]
    last = Job.objects.get(pk=ids[-1])
    [entry] = last.audit
    assert entry == {"at": entry["at"], "by": "zoë", "action": "retry", "queue": "recovery"}
    assert Job.objects.filter(pk__in=ids, audit__isnull=True).count() == 0


#: The engines' insert operations: the statements that put job rows in the table.
INSERT_OPERATIONS = {
    "insert_jobs",
    "insert_rows",
    "insert_unique",
    "insert_workflow",
    "_copy_jobs",  # PostgreSQL's COPY
    "_insert_documents",
    "_insert_or_find",
    "insert_sql",
}


def test_no_module_but_the_pipeline_calls_the_engines_insert_operations():
    """Every job insert goes through the pipeline (django_gator/pipeline/), so none can skip
    its span, wakeup, deferred retries or signal. Inside engines/, an outcome's write inserts
    what it releases (a chain's next step, a batch's callbacks) in its own transaction."""
    import ast

    package = ROOT / "django_gator"
    callers: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in INSERT_OPERATIONS:
                module = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
                callers.setdefault(module, set()).add(node.attr)
    outside = {
        module: names
        for module, names in callers.items()
        if not module.startswith(("django_gator.pipeline.", "django_gator.engines."))
    }
    assert outside == {}, f"insert operations called outside the pipeline: {outside}"
    # Not vacuous: the pipeline is where dispatch and workflows call them.
    through_pipeline = set().union(
        *(names for module, names in callers.items() if module.startswith("django_gator.pipe"))
    )
    assert through_pipeline == {"insert_rows", "insert_unique", "insert_workflow"}


#: Modules outside engines/ that still hold SQL text or branch on the database vendor: none
#: since issue 30 moved them behind the engine. It stays empty: a module that starts doing
#: either fails the test below.
SQL_OUTSIDE_ENGINES: set[str] = set()
#: A string literal that starts an SQL statement, or a comparison of a connection's vendor.
SQL_TEXT = re.compile(
    r"""(?:f?["'])(?:SELECT|UPDATE|INSERT|DELETE|WITH|CREATE|DROP|ALTER|SET|PRAGMA|LOCK)\s"""
)
VENDOR_BRANCH = re.compile(r"\.vendor\s*(?:==|!=|in\b|not\s+in\b)")


def test_sql_and_vendor_branches_live_behind_the_engines():
    package = Path(django_gator.__file__).parent
    offenders = set()
    in_engines = set()
    for path in package.rglob("*.py"):
        relative = path.relative_to(package).as_posix()
        if relative.startswith("migrations/"):
            continue
        source = path.read_text()
        if SQL_TEXT.search(source) or VENDOR_BRANCH.search(source):
            (in_engines if relative.startswith("engines/") else offenders).add(relative)
    # Not vacuous: the patterns find the engines' SQL and vendor branches.
    assert len(in_engines) > 3, "the check found nothing: does it read the package?"
    assert offenders - SQL_OUTSIDE_ENGINES == set(), (
        "SQL or a vendor branch outside django_gator/engines/: move it behind the engine"
    )
    assert SQL_OUTSIDE_ENGINES - offenders == set(), (
        "these modules no longer hold SQL: take them off SQL_OUTSIDE_ENGINES"
    )


def test_every_upward_call_is_installed_by_the_one_wiring_point():
    from django_gator import wiring
    from django_gator.models import job_queries as job_models
    from django_gator.models import workflows as workflow_models

    state = wiring.installed()
    assert len(state) == 8
    assert all(state.values()), state
    hooks = (job_models.cancel_hooks, workflow_models.wake_hooks, workflow_models.signal_hooks)
    before = [list(h) for h in hooks]
    wiring.install()  # idempotent: ready() may run it again (tests, reloads)
    assert [list(h) for h in hooks] == before


#: Private names one module of the package still takes from another, each with the work
#: that removes it. Nothing may be added here: make the name public instead.
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_module(dotted: str, root: Path) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _private_imports(path: Path, root: Path = ROOT) -> set[tuple[str, str]]:
    """(this module, the private name it takes from another module of the package): a
    ``from django_gator... import _name``, or ``module._name`` on a module it imported."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    package_parts = parts[:-1]
    if parts[-1] == "__init__":
        parts.pop()
    module = ".".join(parts)
    tree = ast.parse(path.read_text(), str(path))
    found: set[tuple[str, str]] = set()
    modules: dict[str, str] = {}  # local name -> the package's module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package_parts[: len(package_parts) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            if source.split(".")[0] != "django_gator":
                continue
            for alias in node.names:
                if _private(alias.name) and source != module:
                    found.add((module, f"{source}.{alias.name}"))
                if _package_module(f"{source}.{alias.name}", root):
                    modules[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("django_gator.") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and modules.get(node.value.id, module) != module
            and _private(node.attr)
        ):
            found.add((module, f"{modules[node.value.id]}.{node.attr}"))
    return found


def test_no_module_of_the_package_takes_a_private_name_from_another():
    # import-linter sees modules, not names: this is the check for names. A module's
    # underscored names are its own; another module that needs one needs a public name.
    found = set()
    for path in sorted((ROOT / "django_gator").rglob("*.py")):
        found |= _private_imports(path)
    assert sorted(found - KNOWN_PRIVATE_IMPORTS) == []


def test_the_private_import_check_sees_imports_and_module_attributes(tmp_path):
    # The check itself, on a module written for it in a tree shaped like the package's.
    for name in ("__init__", "worker/__init__", "worker/execution", "worker/outcomes"):
        (tmp_path / "django_gator" / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "django_gator" / f"{name}.py").touch()
    (tmp_path / "django_gator" / "engines").mkdir()
    (tmp_path / "django_gator" / "engines" / "core.py").touch()
    probe = tmp_path / "django_gator" / "worker" / "probe.py"
    probe.write_text(
        "from django_gator.worker.execution import _failure, run_claimed\n"
        "from .outcomes import _steps\n"
        "from django_gator.worker import execution\n"
        "import django_gator.engines.core as core\n"
        "execution._failure\n"
        "core._connection_hook\n"
        "execution.dead_failure\n"
        "def _mine(): pass\n"
    )
    found = _private_imports(probe, tmp_path)
    here = "django_gator.worker.probe"
    assert found == {
        (here, "django_gator.worker.execution._failure"),
        (here, "django_gator.worker.outcomes._steps"),
        (here, "django_gator.engines.core._connection_hook"),
    }


#: The private attributes that job classes had before ``Queueable.traits`` described them
#: (issue 30): other modules read the traits instead.
RETIRED_JOB_ATTRIBUTES = {
    "_gator_accepts_anything",
    "_gator_async",
    "_gator_check_dispatch_options",
    "_gator_keyed",
    "_gator_limited",
    "_gator_signature",
    "_gator_unique",
}


def test_no_module_but_queueable_reads_a_job_classs_gator_attributes():
    """What another module needs to know of a job class is its public ``traits``
    (django_gator/traits.py); the ``_gator_`` attributes Queueable keeps (the argument
    shapes known to bind) are for queueable.py alone."""
    sources = _package_sources()
    own = set(re.findall(r"\b_gator_\w+", sources["queueable.py"]))
    assert own == {"_gator_fits"}, "a new private attribute of job classes: add it to traits"
    names = own | RETIRED_JOB_ATTRIBUTES
    readers = {
        f"{relative}:{node.attr}"
        for relative, source in sources.items()
        if relative != "queueable.py"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in names
    }
    assert readers == set(), "read the job class's traits instead"


#: Modules of the package longer than MODULE_LINES, and functions longer than
#: FUNCTION_LINES, that are still to be split by concern. Both lists may only shrink: a new
#: long module or function fails, and so does one listed here that has been split.
MODULE_LINES = 400
FUNCTION_LINES = 60
LONG_MODULES: set[str] = set()
LONG_FUNCTIONS: set[str] = set()


def _package_sources() -> dict[str, str]:
    package = Path(django_gator.__file__).parent
    return {
        path.relative_to(package).as_posix(): path.read_text()
        for path in package.rglob("*.py")
        if "migrations" not in path.parts
    }


def test_modules_and_functions_stay_short():
    long_modules = set()
    long_functions = set()
    for relative, source in _package_sources().items():
        if source.count("\n") > MODULE_LINES:
            long_modules.add(relative)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > FUNCTION_LINES:
                    long_functions.add(f"{relative}:{node.name}")
    assert long_modules - LONG_MODULES == set(), f"split by concern (over {MODULE_LINES} lines)"
    assert LONG_MODULES - long_modules == set(), "split now: take them off LONG_MODULES"
    assert long_functions - LONG_FUNCTIONS == set(), (
        f"split into named steps (over {FUNCTION_LINES} lines)"
    )
    assert LONG_FUNCTIONS - long_functions == set(), "split now: take them off LONG_FUNCTIONS"
