from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Worker subprocesses started with GATOR_TEST_FAULT fail at a commit boundary.
        from tests import faults

        faults.install_from_env()
