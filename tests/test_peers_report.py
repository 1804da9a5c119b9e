"""The peers benchmark's report: the README's table is printed from a run's JSON."""

from __future__ import annotations

from benchmarks.peers.report import readme_table, table


def _result(peer: str, processes: int, **figures: float | None) -> dict:
    return {"peer": peer, "processes": processes, "note": "", "figures": figures, "remarks": []}


RESULTS = [
    _result("django-gator", 1, noop_per_s=3234.4, enqueue_per_s=1598.0,
            bulk_enqueue_per_s=83354.2, row_fresh_p50_ms=3.31, row_fresh_p95_ms=7.74,
            backlog_p50_ms=4.4),
    _result("django-gator", 2, noop_per_s=5388.0, backlog_p50_ms=7117.0),
    _result("django-q2", 1, noop_per_s=53.0, enqueue_per_s=956.0, bulk_enqueue_per_s=None,
            row_fresh_p50_ms=71.9, row_fresh_p95_ms=None, backlog_p50_ms=None),
]  # fmt: skip


def test_readme_table_has_one_column_per_peer_of_the_chosen_layout():
    lines = readme_table(RESULTS).splitlines()
    assert lines[0] == "|  | django-gator | django-q2 |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert rows["no-op jobs/s"] == "| no-op jobs/s | 3,234 | 53 |"
    assert rows["enqueue/s (bulk)"] == "| enqueue/s (bulk) | 1,598 (83,354) | 956 |"
    row = rows["pickup p50 / p95, row written, fresh worker"]
    assert row.endswith("| 3.3 / 7.7 ms | 71.9 / n/a ms |")
    assert rows["pickup behind a backlog p50"].endswith("| 4.4 ms | n/a |")
    two = readme_table(RESULTS, processes=2)
    assert "| 5,388 |" in two
    assert "| 7.1 s |" in two


def test_full_table_has_a_row_per_peer_and_layout():
    lines = table(RESULTS).splitlines()
    assert len(lines) == 2 + len(RESULTS)
    assert lines[2].startswith("| django-gator | 1 | 3,234 | n/a | 1,598 | 83,354 |")
    assert "| 3.3 / 7.7 |" in lines[2]
