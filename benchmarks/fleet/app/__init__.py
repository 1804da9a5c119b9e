"""The fleet benchmark's jobs and the table they write (see benchmarks/fleet)."""
