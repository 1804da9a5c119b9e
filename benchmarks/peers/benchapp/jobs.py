"""django-gator's job (gator autodiscovers ``jobs`` modules)."""

from django.conf import settings

if settings.PEER == "gator":
    from benchmarks.peers.benchapp import work
    from django_gator import job

    @job(name="peers.work")
    def gator_work(kind: str, number: int) -> None:
        work.run(kind, number)
