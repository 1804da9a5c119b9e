"""``python -m benchmarks.processes``: CPU-bound jobs drained by ``gator_worker
--processes 1`` against ``--processes 2`` (issue 17); see docs/benchmarks.md."""
