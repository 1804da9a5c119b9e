from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "benchmarks.peers.benchapp"
    label = "peers_bench"
    default_auto_field = "django.db.models.BigAutoField"
