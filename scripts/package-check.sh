#!/usr/bin/env bash
# The packaging check (make package-check, CI): build the sdist and the wheel, `twine check`
# them, look inside the wheel, then install the wheel alone into a fresh virtualenv and run a
# job with it: a throwaway Django project (outside this checkout, so nothing is imported from
# the source tree) migrates a SQLite database, dispatches a job and a burst worker runs it.
#
# Usage: PYTHON=python3 [DJANGO='Django>=6.1,<6.2'] [PKG_VENV=.venv-pkg] scripts/package-check.sh
set -euo pipefail

PYTHON=${PYTHON:-python3}
DJANGO=${DJANGO:-}
cd "$(dirname "$0")/.."
root=$(pwd)
PKG_VENV=${PKG_VENV:-.venv-pkg}
pip_quiet=(--quiet --disable-pip-version-check)

work=$(mktemp -d "${TMPDIR:-/tmp}/django-gator-package-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

# 1. The packaging tools, in their own virtualenv (build and twine are not the project's).
if [ ! -x "$PKG_VENV/bin/python" ]; then
  echo "==> package-check: creating $PKG_VENV for build and twine"
  "$PYTHON" -m venv "$PKG_VENV"
fi
"$PKG_VENV/bin/python" -m pip install "${pip_quiet[@]}" --upgrade 'build>=1.2' 'twine>=5'

# 2. sdist, then the wheel built from that sdist (what pip does with an sdist), so a file
#    missing from the sdist fails here.
echo "==> package-check: python -m build"
"$PKG_VENV/bin/python" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || {
  cat "$work/build.log" >&2
  exit 1
}
sdist=$(ls "$work"/dist/django_gator-*.tar.gz)
wheel=$(ls "$work"/dist/django_gator-*.whl)
echo "    $(basename "$sdist")"
echo "    $(basename "$wheel")"

echo "==> package-check: twine check --strict"
"$PKG_VENV/bin/twine" check --strict "$sdist" "$wheel"

echo "==> package-check: the wheel's contents"
"$PKG_VENV/bin/python" - "$wheel" <<'PY'
import sys
import zipfile

names = set(zipfile.ZipFile(sys.argv[1]).namelist())
needed = [
    "django_gator/__init__.py",
    "django_gator/py.typed",
    "django_gator/migrations/0001_initial.py",
    "django_gator/management/commands/gator_worker.py",
    "django_gator/templates/admin/django_gator/job/dead_jobs.html",
]
missing = [name for name in needed if name not in names]
stray = sorted(n for n in names if n.split("/")[0] in ("tests", "testproject", "scripts", "docs"))
if missing or stray:
    sys.exit(f"wheel is missing {missing} or has stray files {stray[:5]}")
print(f"    {len(names)} files; migrations, templates and py.typed included")
PY

# 3. A fresh virtualenv with the wheel and its dependencies only.
echo "==> package-check: installing the wheel into a fresh virtualenv$(if [ -n "$DJANGO" ]; then echo " with $DJANGO"; fi)"
"$PYTHON" -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install "${pip_quiet[@]}" "$wheel" ${DJANGO:+"$DJANGO"}

# 4. A throwaway project that uses it.
project="$work/project"
mkdir -p "$project/shop"
cat >"$project/settings.py" <<'SETTINGS'
SECRET_KEY = "package-check"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_gator", "shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": "db.sqlite3",
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
    }
}
SETTINGS
touch "$project/shop/__init__.py"
cat >"$project/shop/jobs.py" <<'JOBS'
from pathlib import Path

from django_gator import Queueable


class WriteReceipt(Queueable):
    def handle(self, order_id, total):
        Path(f"receipt-{order_id}.txt").write_text(f"order {order_id}: {total}\n")
        return {"order_id": order_id}
JOBS

manage() {
  (cd "$project" && env -u DATABASE_URL PYTHONPATH="$project" DJANGO_SETTINGS_MODULE=settings \
    "$py" -m django "$@")
}

echo "==> package-check: migrate, dispatch, gator_worker --burst in a throwaway project"
manage migrate --noinput -v 0
manage check --database default --fail-level WARNING
manage shell -v 0 -c '
import django_gator, sys
from shop.jobs import WriteReceipt
where = django_gator.__file__
if not where.startswith(sys.prefix) or "'"$root"'" in where:
    sys.exit(f"django_gator was imported from {where}, not from the installed wheel")
job = WriteReceipt.dispatch(42, total="19.99")
print(f"    dispatched job #{job.pk} ({where})")
'
manage gator_worker --burst -v 0
manage shell -v 0 -c '
import sys
from pathlib import Path
from django_gator.models import Job
job = Job.objects.get()
if job.state != "succeeded" or job.result != {"order_id": 42}:
    sys.exit(f"job #{job.pk} ended {job.state} (result {job.result!r}, error {job.last_error!r})")
if Path("receipt-42.txt").read_text() != "order 42: 19.99\n":
    sys.exit("the job did not write its receipt")
print(f"    job #{job.pk} succeeded and wrote its receipt")
'
manage gator_status >/dev/null
echo "==> package-check: OK"
