"""procrastinate's task and django-tasks' task (both autodiscover or import ``tasks``)."""

from django.conf import settings

from benchmarks.peers.benchapp import work

if settings.PEER == "procrastinate":
    from procrastinate.contrib.django import app

    @app.task(name="peers.work")
    def procrastinate_work(kind: str, number: int) -> None:
        work.run(kind, number)

elif settings.PEER == "tasksdb":
    from django_tasks import task

    @task()
    def tasksdb_work(kind: str, number: int) -> None:
        work.run(kind, number)
