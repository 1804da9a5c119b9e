"""The benchmark's Django app: its CPU-bound job, found by the workers' autodiscovery."""
