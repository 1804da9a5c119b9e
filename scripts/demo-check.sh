#!/usr/bin/env bash
# The demo project, non-interactively, on a fresh SQLite file: migrate, create the admin
# user, dispatch the demo jobs, run burst workers until every job is finished (or 120 s
# pass), then check each job's final state and that the admin loads.
#
# Usage: PY=/path/to/venv/bin/python scripts/demo-check.sh   (make demo-check sets PY)
set -euo pipefail

PY=${PY:-$(pwd)/.venv/bin/python}
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-120}  # a deadline, not a wait: a loaded CI machine needed more than 30 s
cd "$(dirname "$0")/../testproject"

workdir=$(mktemp -d "${TMPDIR:-/tmp}/django-gator-demo-check.XXXXXX")
trap 'rm -rf "$workdir"' EXIT
export DATABASE_URL="sqlite:///$workdir/demo.sqlite3"
export PYTHONUNBUFFERED=1
# Keep the demo emails out of the CI log.
export EMAIL_BACKEND=django.core.mail.backends.locmem.EmailBackend

manage() { "$PY" manage.py "$@"; }

echo "==> demo-check: $("$PY" -c 'import django, platform; print(f"Django {django.get_version()}, Python {platform.python_version()}")'), DATABASE_URL=$DATABASE_URL"
manage migrate --noinput -v 0
manage demo_superuser
manage demo_jobs --worker-started

# A burst worker exits as soon as nothing is due, so jobs scheduled a moment ahead (wait=2s,
# retries after 1 s) need another burst: repeat until nothing is left.
deadline=$((SECONDS + DRAIN_TIMEOUT))
round=0
while :; do
  round=$((round + 1))
  echo "==> demo-check: gator_worker --burst (round $round)"
  manage gator_worker --burst
  left=$(manage demo_check --unfinished)
  if [ "$left" = 0 ]; then
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "==> demo-check: $left job(s) still unfinished after ${DRAIN_TIMEOUT}s" >&2
    break
  fi
  echo "==> demo-check: $left job(s) not finished yet (scheduled or retrying)"
  sleep 0.5
done

echo "==> demo-check: checking job states and the admin"
manage demo_check
echo "==> demo-check: OK"
