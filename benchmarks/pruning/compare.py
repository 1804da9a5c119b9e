"""``python -m benchmarks.pruning.compare``: every admin page of ``benchmarks.pruning``,
timed with two trees of the code in turn, on a database that already holds the history.

    git archive 705985b | tar -x -C /tmp/before
    python -m benchmarks.pruning.compare --database-url postgres://...:5495/gator_soak_x \\
        --before /tmp/before --after . --rounds 3

The database is one ``python -m benchmarks.pruning`` fills (for instance on a cluster
started by hand, filled by its ``fill()``; its name must contain "soak"), with the user
``bench``. Each round times every page (:data:`benchmarks.pruning.PAGES`: the median of 3
requests after one that warms up, 1 for a page slower than 3 s) in a new process for each
tree, the order alternating from round to round. Prints each page's medians and writes the
rounds as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROUND = """
import importlib.util, json, os, statistics, sys, time
tree = sys.argv[1]
sys.path.insert(0, tree)
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.pruning.settings"
import django
django.setup()
import django_gator
from django_gator import Queueable
assert django_gator.__file__.startswith(tree), django_gator.__file__
if importlib.util.find_spec("benchmarks.pruning.jobs") is None:  # an older tree
    for name in json.loads(sys.argv[3]):
        type(name, (Queueable,), {"name": f"app.jobs.{name}", "handle": lambda self, *a: None})
from django.contrib.auth import get_user_model
from django.test import Client
client = Client()
client.force_login(get_user_model().objects.get(username="bench"))
out = {}
for label, path in json.loads(sys.argv[2]):
    url = "/admin/django_gator/" + path
    started = time.perf_counter()
    response = client.get(url)
    first = (time.perf_counter() - started) * 1000
    assert response.status_code == 200, (url, response.status_code)
    took = []
    for _ in range(3 if first < 3000 else 1):
        started = time.perf_counter()
        client.get(url)
        took.append((time.perf_counter() - started) * 1000)
    out[label] = statistics.median(took)
print(json.dumps(out))
"""


def main() -> None:
    from benchmarks.pruning.__main__ import PAGES
    from benchmarks.pruning.jobs import NAMES, RARE

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--before", type=Path, required=True, help="a tree of the code")
    parser.add_argument("--after", type=Path, required=True, help="another tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dead-id", type=int, help="the job page's job (default: newest dead)")
    parser.add_argument("--batch-id", type=int, default=1)
    parser.add_argument("--out", type=Path, help="JSON report")
    args = parser.parse_args()
    if "soak" not in args.database_url.rsplit("/", 1)[-1]:
        parser.error("the database's name must contain 'soak' (a benchmark's, not real data)")
    dead = args.dead_id
    if dead is None:
        import psycopg

        with psycopg.connect(args.database_url) as connection:
            row = connection.execute(
                "SELECT max(id) FROM django_gator_job WHERE state = 'dead'"
            ).fetchone()
            dead = row[0] if row else 1
    pages = [(label, path.format(dead=dead, batch=args.batch_id)) for label, path in PAGES]
    env = dict(os.environ, DATABASE_URL=args.database_url)
    trees = {"before": str(args.before.resolve()), "after": str(args.after.resolve())}
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    loads = []
    for round_ in range(args.rounds):
        order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
        for which in order:
            loads.append(os.getloadavg()[0])
            command = [sys.executable, "-c", ROUND, trees[which], json.dumps(pages)]
            done = subprocess.run(
                [*command, json.dumps([*NAMES, RARE])],
                env=env,
                capture_output=True,
                text=True,
                cwd="/",
            )
            if done.returncode:
                raise SystemExit(f"{which} failed:\n{done.stderr[-4000:]}")
            results[which].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1} {which} done", flush=True)
    for label, _ in pages:
        before = statistics.median(r[label] for r in results["before"])
        after = statistics.median(r[label] for r in results["after"])
        print(f"{before:9.0f} {after:9.0f}  {label}")
    print(f"load average (1 min) at each run's start: {min(loads):.1f}-{max(loads):.1f}")
    if args.out:
        report = {"trees": trees, "loads": loads, "pages": pages, "results": results}
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
