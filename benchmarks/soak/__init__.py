"""The soak harness: hours of steady load against real worker processes (issue 15).

Run it with ``make soak`` or ``python -m benchmarks.soak --help``; the figures it produced
are in docs/benchmarks.md ("Steady state (soak)").
"""
