"""A small Celery project's tasks and tests, moved to django-gator by changing their
imports only (see docs/celery.md, "Worked example"): the original import lines are kept
in a comment above the new ones."""
