"""Side-by-side benchmark of django-gator and the job systems Django teams run (issue 20).

``make bench-peers`` builds a virtualenv of its own with the peers at pinned versions
(requirements.txt), then runs ``python -m benchmarks.peers``: each peer in turn, on the same
PostgreSQL server and the same machine, with the same workloads; it prints a table, writes
JSON into benchmarks/results/ and draws docs/peers.png. docs/benchmarks.md ("Side by side")
explains the workloads and the settings each peer runs with.
"""
