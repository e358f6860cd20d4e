from django.apps import AppConfig


class AttemptsConfig(AppConfig):
    name = "attempts"
    verbose_name = "Ledger"

    def ready(self) -> None:
        from attempts import checks, faults  # noqa: F401  (checks registers system checks)

        faults.check_environment()  # fault injection asked for in production: refuse to start
