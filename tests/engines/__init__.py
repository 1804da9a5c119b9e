"""The engine contract's conformance suite: every member of
:class:`django_gator.engines.contract.JobEngine`, run against the real database the test
run uses (SQLite, or DATABASE_URL's PostgreSQL or MariaDB), the same tests for each."""
