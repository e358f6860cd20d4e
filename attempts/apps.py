from django.apps import AppConfig


class AttemptsConfig(AppConfig):
    name = "attempts"
    verbose_name = "Ledger"

    def ready(self) -> None:
        from attempts import checks  # noqa: F401  (registers system checks)
