"""The ceiling of one PostgreSQL server and a fleet of worker hosts (issue 32 item 3): see
main.py, and docs/benchmarks.md for the method."""
