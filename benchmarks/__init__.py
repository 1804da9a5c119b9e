"""Benchmarks and long-running measurements that are not part of the test suite."""
