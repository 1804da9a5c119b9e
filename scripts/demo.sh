#!/usr/bin/env bash
# The interactive demo: migrate, make sure the admin user exists, dispatch the demo jobs,
# then run a worker in the background and the development server in the foreground.
# Ctrl-C stops the server, and the worker with it.
#
# Usage: PY=/path/to/venv/bin/python DEMO_ADDR=127.0.0.1:8000 scripts/demo.sh  (make demo sets both)
set -euo pipefail

PY=${PY:-$(pwd)/.venv/bin/python}
DEMO_ADDR=${DEMO_ADDR:-127.0.0.1:8000}
cd "$(dirname "$0")/../testproject"
export PYTHONUNBUFFERED=1

manage() { "$PY" manage.py "$@"; }

manage migrate --noinput
manage demo_superuser
manage demo_jobs --worker-started

worker=""
stop_worker() {
  trap - EXIT INT TERM
  if [ -n "$worker" ] && kill -0 "$worker" 2>/dev/null; then
    echo "==> demo: stopping the worker (pid $worker)"
    kill -TERM "$worker" 2>/dev/null || true
    wait "$worker" 2>/dev/null || true
  fi
}
trap stop_worker EXIT
trap 'stop_worker; exit 130' INT
trap 'stop_worker; exit 143' TERM

# The worker gets its own session (setsid) so that Ctrl-C reaches only the server; the
# trap then stops the worker with a single SIGTERM, which lets running jobs finish. It starts
# two seconds late so that its log lines follow the banner and the server's startup lines.
start_worker='sleep 2; exec "$0" manage.py gator_worker'
if command -v setsid >/dev/null 2>&1; then
  setsid bash -c "$start_worker" "$PY" &
else
  bash -c "$start_worker" "$PY" &
fi
worker=$!

url="http://$DEMO_ADDR/admin/"
cat <<BANNER

==============================================================================
  django-gator demo
  Admin:     $url
  Log in:    username admin, password admin
  Worker:    pid $worker, starting in 2 s (its log lines appear below)
  Stop:      Ctrl-C stops the server and the worker
==============================================================================

BANNER

manage runserver "$DEMO_ADDR"
