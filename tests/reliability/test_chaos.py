"""Crash safety under fire (RELIABILITY.md "Chaos kill"): worker processes SIGKILLed,
SIGTERMed, frozen and cut off from the database at random while they drain, checked
against a ledger of every run (see tests/chaos.py).

The fast tier runs in ``make test`` on every database. ``make test-chaos`` scales it up
with GATOR_CHAOS_JOBS / GATOR_CHAOS_KILLS / GATOR_CHAOS_FAULTS (and, on PostgreSQL,
restarts the server: ``pg_restart`` in GATOR_CHAOS_FAULTS); its report is printed, and
written as JSON to GATOR_CHAOS_REPORT if set.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest
from django.db import connection

from tests.chaos import Chaos, _parse_faults
from tests.conftest import worker_env

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = int(os.environ.get("GATOR_CHAOS_JOBS", "600"))
KILLS = int(os.environ.get("GATOR_CHAOS_KILLS", "4"))
#: The share of plain jobs without a retry policy: a killed connection or a server restart
#: must not kill them (their attempts cut short by it are given back).
NO_RETRY_SHARE = float(os.environ.get("GATOR_CHAOS_NO_RETRY_SHARE", "0.3"))


def _faults() -> dict[str, int]:
    text = os.environ.get("GATOR_CHAOS_FAULTS")
    if text is not None:
        return _parse_faults(text)
    faults = {"sigterm": 1, "sigstop": 1}
    if connection.vendor != "sqlite":
        faults["connkill"] = 1
    return faults


@pytest.mark.timeout(1800)
def test_faults_under_load_lose_nothing_and_rerun_only_jobs_in_flight(tmp_path: Path):
    chaos = Chaos(
        env=worker_env(),
        jobs=JOBS,
        kills=KILLS,
        faults=_faults(),
        seed=int(os.environ.get("GATOR_CHAOS_SEED", "20261123")),
        no_retry_share=NO_RETRY_SHARE,
        log_dir=tmp_path,
    )
    try:
        report = chaos.run()
    finally:
        chaos.kill_everything()
    print("\n" + report.summary())
    if os.environ.get("GATOR_CHAOS_REPORT"):
        Path(os.environ["GATOR_CHAOS_REPORT"]).write_text(json.dumps(asdict(report), indent=2))

    assert report.lost == []
    assert report.stuck == []
    assert report.duplicated == []
    assert report.over_limit == []
    assert report.atomic_duplicates == []
    assert report.bad_exits == []
    assert report.leftover_workers == []
    assert report.faults["sigkill"] == KILLS, "the jobs drained before every kill was made"
