# django-gator developer tasks (GNU make).
#
#   make install       create $(VENV) and install the package with every extra (fast when current)
#   make test          the test suite on SQLite, PostgreSQL and MariaDB/MySQL, one after another
#   make test-sqlite | test-postgres | test-mysql
#   make test-chaos    the chaos tier: 10,000 jobs and 20 SIGKILLs (and more) on PostgreSQL,
#                      smaller runs on MariaDB and SQLite (its halves: test-chaos-postgres,
#                      test-chaos-others)
#   make test-browser  the admin screens in headless Chromium (Playwright), on SQLite
#   make soak          hours of steady load on PostgreSQL, a report per minute (not in make test)
#   make bench-fleet   the ceiling of one PostgreSQL, and workers on three network hosts
#                      (namespaces), directly and through PgBouncer; as root (not in make test)
#   make soak-day      a day's load (100M jobs/day) in an hour on a throwaway PostgreSQL 15:
#                      1,200 jobs/s, web-like dispatchers, SOAK_DAY_PARTITIONING=hour|day|none
#   make soak-day-both the hour on partitioned storage, then with DELETE pruning, side by side
#   make bench-admin-volume  the admin's pages and /metrics timed on 20M jobs (VOLUME_ROWS)
#   make bench-conversion    the online conversion of 5M jobs to partitioned storage, timed
#   make bench-peers   django-gator beside Celery, procrastinate, django-q2, django-tasks-db
#   make browser-deps  what test-browser needs: Chromium (apt-get, as root) and playwright
#   make lint          ruff check, ruff format --check, mypy, lint-imports (the layers)
#   make demo          the demo project: migrate, admin user, demo jobs, a worker and runserver
#                      (in .venv-demo, with only what SQLite needs: Python is all it requires)
#   make demo-check    the demo project, non-interactive, checked (for CI)
#   make package-check build the sdist and wheel, twine check them, run a job from the wheel
#   make docs          the documentation site (MkDocs, strict) into site/, in .venv-docs
#   make clean         caches, build files, demo databases;  make distclean also removes venvs
#
# Variables, set on the command line: make test PYTHON=python3.12 VENV=.venv-dj6 DJANGO='Django>=6.1,<6.2'
#   PYTHON VENV DEMO_VENV DJANGO PG_URL MYSQL_URL PYTEST_ARGS TEST_DB_SUFFIX DEMO_ADDR SOAK_*
#   FLEET_* VOLUME_* CONVERSION_* (see below). Without CI=true,
#   make test skips (loudly) a database server that does not answer; with CI=true it fails.

PYTHON      ?= python3
VENV        ?= .venv
# The demo's virtualenv: the package and django-environ, no database drivers to build.
DEMO_VENV   ?= .venv-demo
# build and twine, for package-check.
PKG_VENV    ?= .venv-pkg
# MkDocs, Material and mkdocstrings (the docs extra), for make docs: no database driver.
DOCS_VENV   ?= .venv-docs
# An extra pip requirement pinning the Django line, e.g. DJANGO='Django>=6.1,<6.2'.
DJANGO      ?=
PG_URL      ?= postgres://postgres@127.0.0.1:5432/test
MYSQL_URL   ?= mysql://root@127.0.0.1:3306/test
PYTEST_ARGS ?=
# More pytest arguments for one database's run only (CI shares the tests that start worker
# processes out between its two lines this way: see .ci/run).
PYTEST_ARGS_SQLITE   ?=
PYTEST_ARGS_POSTGRES ?=
PYTEST_ARGS_MYSQL    ?=
# Optional: run the PostgreSQL/MariaDB tests in test_<name>_<suffix> instead of test_<name>
# (through pytest-django's TOX_PARALLEL_ENV hook), so that runs sharing a server don't drop
# each other's test database. .ci/run sets it.
TEST_DB_SUFFIX ?=
DEMO_ADDR   ?= 127.0.0.1:8000

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV_PY     := $(VENV)/bin/python
VENV_ABS_PY := $(abspath $(VENV))/bin/python
STAMP       := $(VENV)/.gator-installed
# Records PYTHON and DJANGO, so that changing either reinstalls.
VENV_CONFIG := $(VENV)/.gator-config
INSTALL_CONFIG := python=$(PYTHON) django=$(DJANGO)
DEMO_ABS_PY := $(abspath $(DEMO_VENV))/bin/python
DEMO_STAMP  := $(DEMO_VENV)/.gator-installed
DEMO_CONFIG := $(DEMO_VENV)/.gator-config

.PHONY: help install demo-install sysdeps test-deps test test-sqlite test-postgres test-mysql \
        test-chaos test-chaos-postgres test-chaos-others check-dbs lint browser-deps test-browser bench-deps soak soak-day soak-day-both \
        soak-day-report bench-admin-volume bench-conversion bench-fleet bench-peers demo demo-check \
        package-check docs docs-install clean distclean FORCE

help:
	@sed -n '3,/^$$/s/^# \{0,1\}//p' $(MAKEFILE_LIST)

# ---------------------------------------------------------------------------------------------
# Installing

# mysqlclient builds against the MariaDB/MySQL client library, found through pkg-config.
define check_sysdeps
if pkg-config --exists libmariadb 2>/dev/null || pkg-config --exists mysqlclient 2>/dev/null; then \
  :; \
elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
  echo "==> mysqlclient needs pkg-config and libmariadb-dev; installing them with apt-get"; \
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y pkg-config libmariadb-dev; \
else \
  echo "ERROR: the mysql extra (mysqlclient) needs pkg-config and the MariaDB or MySQL client" >&2; \
  echo "       development files, and neither 'pkg-config --exists libmariadb' nor" >&2; \
  echo "       'pkg-config --exists mysqlclient' succeeds. Install them, then re-run make:" >&2; \
  echo "         Debian/Ubuntu:  sudo apt-get install pkg-config libmariadb-dev build-essential" >&2; \
  echo "         Fedora/RHEL:    sudo dnf install pkgconf-pkg-config mariadb-connector-c-devel gcc" >&2; \
  echo "         macOS:          brew install pkg-config mysql-client" >&2; \
  exit 1; \
fi
endef

sysdeps:
	@$(check_sysdeps)

# Tools some tests need, from Debian packages: the partition tests (tests/reliability/test_partitions.py)
# cut a worker process off the database with iptables, as root; the PgBouncer tests
# (tests/reliability/test_pgbouncer.py) start their own pgbouncer in front of PostgreSQL. Without the
# tool those tests skip, saying why. As root with apt-get, the test targets install it;
# under CI=true a missing tool that cannot be installed is an error.
# $(call check_tool,COMMAND (= its package),TESTS)
define check_tool
if command -v $(1) >/dev/null 2>&1 || [ -x /usr/sbin/$(1) ]; then \
  :; \
elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
  echo "==> the $(2) tests need $(1); installing it with apt-get"; \
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(1); \
elif [[ "$${CI:-}" =~ ^([Tt]rue|TRUE|1|yes)$$ ]]; then \
  echo "ERROR: the $(2) tests need $(1) (and root to install it); CI=$${CI}, so this fails." >&2; \
  exit 1; \
else \
  echo "NOTE: no $(1): the $(2) tests will skip (as root: apt-get install $(1))"; \
fi
endef

test-deps:
	@$(call check_tool,iptables,partition)
	@$(call check_tool,pgbouncer,PgBouncer)

install: $(STAMP)

$(VENV_CONFIG): FORCE
	@mkdir -p $(VENV)
	@echo '$(INSTALL_CONFIG)' | cmp -s - $@ || echo '$(INSTALL_CONFIG)' > $@

# $(call ensure_venv,DIR): create the virtualenv DIR with $(PYTHON), or check that the one
# there has the same Python version.
define ensure_venv
if [ ! -x $(1)/bin/python ]; then \
  echo "==> creating $(1) with $(PYTHON)"; \
  $(PYTHON) -m venv $(1) || exit 1; \
else \
  want=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])') || exit 1; \
  have=$$($(1)/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
  if [ "$$want" != "$$have" ]; then \
    echo "ERROR: $(1) has Python $$have but PYTHON=$(PYTHON) is Python $$want." >&2; \
    echo "       Use another virtualenv directory, or remove $(1) to recreate it." >&2; \
    exit 1; \
  fi; \
fi
endef

$(STAMP): pyproject.toml $(VENV_CONFIG)
	@$(check_sysdeps)
	@$(call ensure_venv,$(VENV))
	@echo "==> installing django-gator[postgres,mysql,dev]$(if $(DJANGO), and $(DJANGO)) into $(VENV)"
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check \
	  -e '.[postgres,mysql,dev]' $(if $(DJANGO),'$(DJANGO)')
	@touch $@

# The demo's own virtualenv: the package and the demo extra (django-environ), no database
# driver, so nothing to compile and no system package (MariaDB headers) or root needed.
demo-install: $(DEMO_STAMP)

# $(call extra_venv,DIR,EXTRA[,PIP OPTIONS]): the recipe of a virtualenv DIR holding the
# package with one extra (and DJANGO), for the demo's and the docs' virtualenvs.
define extra_venv
$(call ensure_venv,$(1)); \
echo "==> installing django-gator[$(2)]$(if $(DJANGO), and $(DJANGO)) into $(1)"; \
$(1)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip && \
$(1)/bin/python -m pip install --quiet --disable-pip-version-check $(3) \
  -e '.[$(2)]' $(if $(DJANGO),'$(DJANGO)')
endef

$(DEMO_CONFIG): FORCE
	@mkdir -p $(DEMO_VENV)
	@echo '$(INSTALL_CONFIG)' | cmp -s - $@ || echo '$(INSTALL_CONFIG)' > $@

$(DEMO_STAMP): pyproject.toml $(DEMO_CONFIG)
	@$(call extra_venv,$(DEMO_VENV),demo)
	@touch $@

FORCE:

# ---------------------------------------------------------------------------------------------
# Tests

# $(call header,what): a banner naming the database and the Django and Python versions.
define header
printf '\n==================== pytest on %s: %s ====================\n' '$(1)' \
  "$$($(VENV_PY) -c 'import django, platform; print(f"Django {django.get_version()}, Python {platform.python_version()}")')"
endef

# $(call on_server_db,name,url): run the suite on a database server if it answers. When it
# does not: a failure if CI=true, otherwise a loud SKIPPED line.
define on_server_db
shown=$$(echo '$(2)' | sed -E 's#(://[^:/@]*):[^@]*@#\1:***@#'); \
if $(VENV_PY) scripts/db_ping.py --quiet '$(2)'; then \
  $(call header,$(1)); \
  $(if $(TEST_DB_SUFFIX),TOX_PARALLEL_ENV='$(TEST_DB_SUFFIX)') DATABASE_URL='$(2)' \
    $(VENV_PY) -m pytest $(PYTEST_ARGS) $(3); \
elif [[ "$${CI:-}" =~ ^([Tt]rue|TRUE|1|yes)$$ ]]; then \
  echo; \
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2; \
  echo "!!! ERROR: $(1) is not reachable at $$shown" >&2; \
  echo "!!! CI=$${CI}, so a missing database fails the build instead of skipping its tests." >&2; \
  echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2; \
  exit 1; \
else \
  echo; \
  echo "******************************************************************************"; \
  echo "*** SKIPPED: $(1) tests: $(1) is not reachable at $$shown"; \
  echo "*** (start it, or point the URL elsewhere; under CI=true this is an error)"; \
  echo "******************************************************************************"; \
fi
endef

# All three, even if one fails; fails at the end if any did.
test: install
	@failed=""; \
	$(MAKE) --no-print-directory test-sqlite || failed="$$failed SQLite"; \
	$(MAKE) --no-print-directory test-postgres || failed="$$failed PostgreSQL"; \
	$(MAKE) --no-print-directory test-mysql || failed="$$failed MariaDB/MySQL"; \
	if [ -n "$$failed" ]; then echo; echo "==> make test FAILED on:$$failed" >&2; exit 1; fi; \
	echo; echo "==> make test: passed (see above for any SKIPPED database)"

test-sqlite: install
	@$(call header,SQLite)
	env -u DATABASE_URL $(VENV_PY) -m pytest $(PYTEST_ARGS) $(PYTEST_ARGS_SQLITE)

test-postgres: install test-deps
	@$(call on_server_db,PostgreSQL,$(PG_URL),$(PYTEST_ARGS_POSTGRES))

test-mysql: install test-deps
	@$(call on_server_db,MariaDB/MySQL,$(MYSQL_URL),$(PYTEST_ARGS_MYSQL))

# The larger chaos tier (tests/chaos.py): worker processes SIGKILLed, SIGTERMed, frozen and
# cut off from the database while they drain, then a ledger check. PostgreSQL gets the big
# run (and a server restart, which needs root and pg_ctlcluster: drop pg_restart from
# CHAOS_PG_FAULTS without them); MariaDB and SQLite a medium one. Each prints its report.
CHAOS_JOBS       ?= 10000
CHAOS_KILLS      ?= 20
CHAOS_PG_FAULTS  ?= sigterm=3,sigstop=2,connkill=3,pg_restart=1
CHAOS_SMALL_JOBS ?= 3000
CHAOS_SMALL_KILLS ?= 8
# Issue 18's batch proof (tests/reliability/test_batch_chaos.py), on each database (10,000 members and
# 6 SIGKILLs: 29-51 s each, 2026-11-24).
CHAOS_BATCH_JOBS ?= 10000
CHAOS_PYTEST = $(VENV_PY) -m pytest tests/reliability/test_chaos.py -s -p no:cacheprovider $(PYTEST_ARGS)
# test-chaos-postgres and test-chaos-others are its two halves (CI runs the second beside
# its test lines and the first, which restarts the server, after them).
test-chaos: install
	@failed=""; \
	$(MAKE) --no-print-directory test-chaos-postgres || failed="$$failed PostgreSQL"; \
	$(MAKE) --no-print-directory test-chaos-others || failed="$$failed MariaDB/SQLite"; \
	if [ -n "$$failed" ]; then echo; echo "==> make test-chaos FAILED on:$$failed" >&2; exit 1; fi; \
	echo; echo "==> make test-chaos: passed"

# $(call batch_chaos,URL or empty for SQLite): issue 18's batch proof on one database.
define batch_chaos
echo; echo "==> Batch chaos: $(CHAOS_BATCH_JOBS) members / 6 SIGKILLs on $(or $(1),SQLite)"; \
$(if $(TEST_DB_SUFFIX),TOX_PARALLEL_ENV='$(TEST_DB_SUFFIX)') DATABASE_URL='$(1)' \
  GATOR_BATCH_CHAOS_JOBS=$(CHAOS_BATCH_JOBS) GATOR_BATCH_CHAOS_KILLS=6 \
  $(VENV_PY) -m pytest tests/reliability/test_batch_chaos.py -s -p no:cacheprovider $(PYTEST_ARGS)
endef

test-chaos-postgres: install
	@failed=""; \
	$(call header,PostgreSQL chaos: $(CHAOS_JOBS) jobs / $(CHAOS_KILLS) SIGKILLs and more faults); \
	$(if $(TEST_DB_SUFFIX),TOX_PARALLEL_ENV='$(TEST_DB_SUFFIX)') DATABASE_URL='$(PG_URL)' \
	  GATOR_CHAOS_JOBS=$(CHAOS_JOBS) GATOR_CHAOS_KILLS=$(CHAOS_KILLS) \
	  GATOR_CHAOS_FAULTS='$(CHAOS_PG_FAULTS)' GATOR_CHAOS_REPORT=$${GATOR_CHAOS_REPORT:-} \
	  $(CHAOS_PYTEST) || failed="$$failed chaos"; \
	$(call batch_chaos,$(PG_URL)) || failed="$$failed batch"; \
	if [ -n "$$failed" ]; then echo; echo "==> make test-chaos-postgres FAILED on:$$failed" >&2; exit 1; fi; \
	echo; echo "==> make test-chaos-postgres: passed"

test-chaos-others: install
	@failed=""; \
	$(call header,MariaDB chaos: $(CHAOS_SMALL_JOBS) jobs / $(CHAOS_SMALL_KILLS) SIGKILLs); \
	$(if $(TEST_DB_SUFFIX),TOX_PARALLEL_ENV='$(TEST_DB_SUFFIX)') DATABASE_URL='$(MYSQL_URL)' \
	  GATOR_CHAOS_JOBS=$(CHAOS_SMALL_JOBS) GATOR_CHAOS_KILLS=$(CHAOS_SMALL_KILLS) \
	  GATOR_CHAOS_FAULTS=sigterm=2,sigstop=1,connkill=2 GATOR_CHAOS_REPORT= \
	  $(CHAOS_PYTEST) || failed="$$failed MariaDB"; \
	$(call header,SQLite chaos: $(CHAOS_SMALL_JOBS) jobs / $(CHAOS_SMALL_KILLS) SIGKILLs); \
	env -u DATABASE_URL GATOR_CHAOS_JOBS=$(CHAOS_SMALL_JOBS) GATOR_CHAOS_KILLS=$(CHAOS_SMALL_KILLS) \
	  GATOR_CHAOS_FAULTS=sigterm=2,sigstop=1 GATOR_CHAOS_REPORT= \
	  $(CHAOS_PYTEST) || failed="$$failed SQLite"; \
	$(call batch_chaos,$(MYSQL_URL)) || failed="$$failed batch:MariaDB"; \
	$(call batch_chaos,) || failed="$$failed batch:SQLite"; \
	if [ -n "$$failed" ]; then echo; echo "==> make test-chaos-others FAILED on:$$failed" >&2; exit 1; fi; \
	echo; echo "==> make test-chaos-others: passed"

# The browser tests (tests/browser): Playwright for Python driving the system's Chromium
# (GATOR_CHROMIUM, default /usr/bin/chromium; Playwright's own browser download is not used).
# Opt-in: plain `make test` collects them too, and skips them when either is missing;
# test-browser sets GATOR_BROWSER_TESTS=required, so there a missing one fails instead.
# On another Django line: make test-browser PYTHON=python3.12 VENV=.venv-dj6 DJANGO='Django>=6.1,<6.2'
# (CI runs both 5.2 and 6.1: the admin's markup and CSS differ between them).
browser-deps: install
	@chromium="$${GATOR_CHROMIUM:-/usr/bin/chromium}"; \
	if [ -x "$$chromium" ]; then \
	  :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "==> the browser tests need Chromium; installing it with apt-get"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium || exit 1; \
	else \
	  echo "ERROR: the browser tests need Chromium at $$chromium, and it is not there." >&2; \
	  echo "       Install it (Debian/Ubuntu: sudo apt-get install chromium), or point" >&2; \
	  echo "       GATOR_CHROMIUM at a Chromium or Chrome binary, then re-run make." >&2; \
	  exit 1; \
	fi
	@echo "==> installing playwright into $(VENV) (the tests use the system Chromium)"
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check 'playwright>=1.40'

test-browser: install browser-deps
	@$(call header,SQLite (browser tests))
	env -u DATABASE_URL GATOR_BROWSER_TESTS=required $(VENV_PY) -m pytest tests/browser $(PYTEST_ARGS)

# Both servers must answer (used by .ci/run before anything else).
check-dbs: install
	@ok=1; \
	$(VENV_PY) scripts/db_ping.py '$(PG_URL)' || ok=0; \
	$(VENV_PY) scripts/db_ping.py '$(MYSQL_URL)' || ok=0; \
	if [ $$ok = 0 ]; then \
	  echo "!!! ERROR: a database server is not reachable (see above); PG_URL and MYSQL_URL" >&2; \
	  echo "!!! choose them (now '$(PG_URL)' and '$(MYSQL_URL)')." >&2; \
	  exit 1; \
	fi

# ---------------------------------------------------------------------------------------------
# The soak (benchmarks/soak, issue 15): jobs dispatched at a fixed rate for a set time to real
# `gator_worker` processes, with a report per minute (claim and success-mark latency, drain
# lag, dead tuples, worker RSS and threads, the workers' database CPU) written as JSON under
# benchmarks/results/ and drawn into docs/soak-<cluster>.png. Not part of `make test`.
#   SOAK_CLUSTER=shared     the server at SOAK_URL; its database (name must contain "soak")
#                           is dropped and re-created
#   SOAK_CLUSTER=throwaway  a temporary cluster (initdb, port SOAK_PORT, autovacuum on with
#                           the recommended per-table settings), removed afterwards; needs
#                           PostgreSQL's binaries (SOAK_ARGS=--pg-bindir ...) and, as root,
#                           runs the server as the postgres user
# Empty SOAK_DURATION / SOAK_RATE take the harness's defaults: 30m and 200 jobs/s (50 jobs/s
# with SOAK_ARGS=--long-transaction, which runs until 5 windows of 6,000 jobs are done).
# The mix has this round's features (limits, async, snooze, batches, workflows), automatic
# pruning after 5 minutes and /metrics on each worker; the run ends with checks and exits 1
# if one fails. MariaDB: SOAK_URL=mysql://root@127.0.0.1:3306/gator_soak (shared only).
SOAK_DURATION    ?=
SOAK_RATE        ?=
SOAK_WORKERS     ?= 2
SOAK_CONCURRENCY ?= 8
SOAK_URL         ?= postgres://postgres@127.0.0.1:5432/gator_soak
SOAK_CLUSTER     ?= shared
SOAK_PORT        ?= 5499
SOAK_ARGS        ?=
BENCH_STAMP := $(VENV)/.gator-bench-installed

$(BENCH_STAMP): $(STAMP)
	@echo "==> installing the bench extra (matplotlib) into $(VENV)"
	$(VENV_PY) -m pip install --quiet --disable-pip-version-check \
	  -e '.[postgres,mysql,dev,bench]' $(if $(DJANGO),'$(DJANGO)')
	@touch $@

bench-deps: $(BENCH_STAMP)

soak: install bench-deps
	$(VENV_PY) -m benchmarks.soak --cluster $(SOAK_CLUSTER) --database-url '$(SOAK_URL)' \
	  --port $(SOAK_PORT) --workers $(SOAK_WORKERS) --concurrency $(SOAK_CONCURRENCY) \
	  $(if $(SOAK_DURATION),--duration $(SOAK_DURATION)) $(if $(SOAK_RATE),--rate $(SOAK_RATE)) \
	  $(SOAK_ARGS)

# A day's load in an hour (issue 32; docs/benchmarks.md "A day's load in an hour"): on a
# throwaway PostgreSQL 15 cluster configured like production (autovacuum on, shared_buffers
# a quarter of RAM up to 4GB: benchmarks/soak/dayrun.py), SOAK_DAY_WEB web-like processes
# (single dispatches, some in transaction.atomic() and with on_commit, dispatch_many bursts,
# delayed jobs, failures that retry, rollbacks) beside the harness's mix (limits, batches,
# workflows, async, snoozes), 5 minutes' retention (pruning every minute; on partitioned
# storage, hour partitions dropped once past it). Writes benchmarks/results/soak-day-<storage>.json
# and its chart beside it; exits 1 if a check fails. soak-day-both runs partitioned storage,
# then DELETE pruning, then soak-day-report prints them side by side and draws docs/soak-day.png.
SOAK_DAY_RATE        ?= 1200
SOAK_DAY_DURATION    ?= 60m
SOAK_DAY_PARTITIONING ?= hour
SOAK_DAY_WEB         ?= 4
SOAK_DAY_WORKERS     ?= 1
SOAK_DAY_CONCURRENCY ?= 48
SOAK_DAY_PORT        ?= 5498
SOAK_DAY_ARGS        ?=
SOAK_DAY_RESULTS     := benchmarks/results/soak-day
soak-day: install bench-deps
	$(VENV_PY) -m benchmarks.soak --cluster throwaway --port $(SOAK_DAY_PORT) \
	  --database-url postgres://postgres@127.0.0.1:$(SOAK_DAY_PORT)/gator_soak \
	  --rate $(SOAK_DAY_RATE) --duration $(SOAK_DAY_DURATION) --workers $(SOAK_DAY_WORKERS) \
	  --concurrency $(SOAK_DAY_CONCURRENCY) --web $(SOAK_DAY_WEB) \
	  --partitioning $(SOAK_DAY_PARTITIONING) --prune-after 5m --prune-interval 60s \
	  --out $(SOAK_DAY_RESULTS)-$(SOAK_DAY_PARTITIONING).json \
	  --chart docs/soak-day-$(SOAK_DAY_PARTITIONING).png $(SOAK_DAY_ARGS)

soak-day-both: install bench-deps
	@failed=""; \
	$(MAKE) --no-print-directory soak-day SOAK_DAY_PARTITIONING=hour || failed="$$failed hour"; \
	$(MAKE) --no-print-directory soak-day SOAK_DAY_PARTITIONING=none || failed="$$failed none"; \
	$(MAKE) --no-print-directory soak-day-report; \
	if [ -n "$$failed" ]; then echo "==> soak-day FAILED on:$$failed" >&2; exit 1; fi

soak-day-report: bench-deps
	$(VENV_PY) -m benchmarks.soak.day_report $(SOAK_DAY_RESULTS)-hour.json \
	  $(SOAK_DAY_RESULTS)-none.json --chart docs/soak-day.png

# The admin and /metrics at volume (issue 32, item 4): VOLUME_ROWS jobs bulk-loaded into a
# throwaway cluster, on the plain table and on partitioned storage, every admin page and a
# /metrics scrape timed (benchmarks/admin_volume). 20M rows need ~20 GiB free in $$TMPDIR:
# the benchmark checks with df first.
VOLUME_ROWS ?= 20000000
VOLUME_ARGS ?=
bench-admin-volume: install
	$(VENV_PY) -m benchmarks.admin_volume --rows $(VOLUME_ROWS) $(VOLUME_ARGS)

# The online conversion to partitioned storage (issue 32, item 1): CONVERSION_ROWS jobs
# bulk-loaded into a throwaway cluster's plain table, then `gator_partitions --convert`'s
# conversion while a worker claims and a process dispatches 200 jobs/s throughout
# (benchmarks/conversion): each step's duration, the claims' pickup and gaps per phase, no
# job lost or run twice. 5M rows need ~12 GiB free in $$TMPDIR.
CONVERSION_ROWS ?= 5000000
CONVERSION_ARGS ?=
bench-conversion: install
	$(VENV_PY) -m benchmarks.conversion --rows $(CONVERSION_ROWS) $(CONVERSION_ARGS)

# ---------------------------------------------------------------------------------------------
# The ceiling and a fleet (benchmarks/fleet, issue 32 item 3), on a throwaway PostgreSQL 15
# cluster (port FLEET_PORT), as root: the ceiling steps the dispatch rate up (FLEET_HOLD
# seconds per rate, 600 in the published run) until the backlog is no longer bounded and
# names what saturated; the fleet runs 1, 2, 4, 8 and 12 worker processes over three network
# hosts (Linux network namespaces with veth links to this host, made and removed by the
# benchmark; iproute2), directly and through PgBouncer in transaction mode (the Debian
# pgbouncer package), FLEET_STEP seconds per step. JSON in benchmarks/results/fleet.json, the
# chart in docs/fleet.png; exits 1 if the throughput fell by more than 10 % as processes were
# added, or a claim p99 passed its bound. After an interrupted run: FLEET_ARGS=--cleanup.
#   FLEET_ARGS='--part fleet --processes 1,2,4 --step 30'   a short run
#   FLEET_ARGS='--part fleet --modes direct --worker raw'   the control: the same steps with a
#     worker that is not django-gator (benchmarks/fleet/rawworker.py), fleet-control.json
FLEET_PORT ?= 5498
FLEET_HOLD ?= 600
FLEET_STEP ?= 120
FLEET_ARGS ?=

bench-fleet: install bench-deps
	$(VENV_PY) -m benchmarks.fleet --port $(FLEET_PORT) --hold $(FLEET_HOLD) --step $(FLEET_STEP) \
	  --check $(FLEET_ARGS)

# ---------------------------------------------------------------------------------------------
# Side by side (benchmarks/peers, issue 20): django-gator, Celery (Redis broker; threads and
# prefork pools), procrastinate, django-q2 (ORM broker) and django-tasks-db, one after another
# on the same PostgreSQL server, with the same workloads; prints a table, writes
# benchmarks/results/peers.json and draws docs/peers.png. Needs PostgreSQL (its database,
# whose name must contain "peers", is dropped and re-created per peer) and Redis (Celery's
# broker, and the ledger every peer's jobs report their start times to). The peers live in a
# virtualenv of their own (PEERS_VENV), at the versions in benchmarks/peers/requirements.txt.
#   PEERS=celery-threads,django-gator   a subset;  PEERS_ARGS=--quick   a smoke run
PEERS_VENV  ?= .venv-peers
PEERS_URL   ?= postgres://postgres@127.0.0.1:5432/gator_peers
PEERS_REDIS ?= redis://127.0.0.1:6379
PEERS       ?=
PEERS_ARGS  ?=
PEERS_STAMP := $(PEERS_VENV)/.gator-installed

$(PEERS_STAMP): pyproject.toml benchmarks/peers/requirements.txt
	@$(call ensure_venv,$(PEERS_VENV))
	@echo "==> installing the peers (benchmarks/peers/requirements.txt) into $(PEERS_VENV)"
	$(PEERS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
	  -r benchmarks/peers/requirements.txt -e '.[postgres]'
	@touch $@

bench-peers: $(PEERS_STAMP)
	@$(PEERS_VENV)/bin/python scripts/db_ping.py --tcp '$(PEERS_URL)'
	@$(PEERS_VENV)/bin/python -c "import redis, sys; redis.Redis.from_url(sys.argv[1]).ping()" \
	  '$(PEERS_REDIS)' || { echo "ERROR: Redis does not answer at $(PEERS_REDIS)" >&2; exit 1; }
	$(PEERS_VENV)/bin/python -m benchmarks.peers --database-url '$(PEERS_URL)' \
	  --redis-url '$(PEERS_REDIS)' $(if $(PEERS),--peers $(PEERS)) $(PEERS_ARGS)

# ---------------------------------------------------------------------------------------------
# Lint: all three checks run; fails if any failed.

lint: install
	@status=0; \
	echo "==> ruff check ."; $(VENV)/bin/ruff check . || status=1; \
	echo "==> ruff format --check ."; $(VENV)/bin/ruff format --check . || status=1; \
	echo "==> mypy django_gator"; $(VENV)/bin/mypy django_gator || status=1; \
	echo "==> lint-imports (.importlinter)"; $(VENV)/bin/lint-imports --no-cache || status=1; \
	if [ $$status != 0 ]; then echo "==> make lint FAILED" >&2; fi; \
	exit $$status

# ---------------------------------------------------------------------------------------------
# Demo project (testproject/)

demo: demo-install
	@PY='$(DEMO_ABS_PY)' DEMO_ADDR='$(DEMO_ADDR)' bash scripts/demo.sh

demo-check: demo-install
	@PY='$(DEMO_ABS_PY)' bash scripts/demo-check.sh

# ---------------------------------------------------------------------------------------------
# Packaging: sdist and wheel built, twine-checked, the wheel installed alone into a fresh
# virtualenv and a job run with it (scripts/package-check.sh). Needs no database server.

package-check:
	@PYTHON='$(PYTHON)' DJANGO='$(DJANGO)' PKG_VENV='$(PKG_VENV)' bash scripts/package-check.sh

# ---------------------------------------------------------------------------------------------
# Documentation site (mkdocs.yml): built strictly, so a broken link or anchor, a missing page
# or API reference fails it. Its own virtualenv with the docs extra: Python and PyPI are all
# it needs (no database driver to compile, no root). Its code examples run in the test suite
# (tests/test_docs_examples.py). CI makes it fresh each run, so pip skips byte-compiling
# (Python writes what the build imports).

DOCS_STAMP  := $(DOCS_VENV)/.gator-installed
DOCS_CONFIG := $(DOCS_VENV)/.gator-config

$(DOCS_CONFIG): FORCE
	@mkdir -p $(DOCS_VENV)
	@echo '$(INSTALL_CONFIG)' | cmp -s - $@ || echo '$(INSTALL_CONFIG)' > $@

$(DOCS_STAMP): pyproject.toml $(DOCS_CONFIG)
	@$(call extra_venv,$(DOCS_VENV),docs,--no-compile)
	@touch $@

docs-install: $(DOCS_STAMP)

docs: docs-install
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

# ---------------------------------------------------------------------------------------------

clean:
	rm -rf build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	rm -f testproject/db.sqlite3 testproject/db.sqlite3-wal testproject/db.sqlite3-shm \
	  testproject/db.sqlite3-gator.lock
	find . -path './.venv*' -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(DEMO_VENV) $(PKG_VENV) $(DOCS_VENV) .venv .venv-dj6 .venv-demo .venv-pkg .venv-docs
