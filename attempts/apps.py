from django.apps import AppConfig


class AttemptsConfig(AppConfig):
    name = "attempts"
    verbose_name = "Ledger"

    def ready(self) -> None:
        from attempts import (  # noqa: F401  (checks registers system checks)
            checks,
            config_history,  # noqa: F401  (records every authority change)
            faults,
        )

        faults.check_environment()  # fault injection asked for in production: refuse to start
