from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _reinstall_history_guards(sender, using, **kwargs):
    from django.db import connections

    from attempts import history_guard

    history_guard.install(connections[using])


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
        post_migrate.connect(_reinstall_history_guards, sender=self)
