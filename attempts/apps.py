from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_migrate, post_save


def _reinstall_history_guards(sender, using, **kwargs):
    from django.db import connections

    from attempts import history_guard

    history_guard.install(connections[using])


class AttemptsConfig(AppConfig):
    name = "attempts"
    verbose_name = "Ledger"

    def ready(self) -> None:
        from attempts import checks, faults  # noqa: F401  (checks registers system checks)

        faults.check_environment()  # fault injection asked for in production: refuse to start
        post_migrate.connect(_reinstall_history_guards, sender=self)
        self._watch_access()

    def _watch_access(self) -> None:
        """Any change to who may do what makes the API's remembered answers stale."""
        from attempts import access_cache
        from attempts.models import AgentToken, Grant, Tool

        links = AgentToken.tenants.through
        for model in (AgentToken, links, Grant, Tool):
            post_save.connect(access_cache.on_access_change, sender=model, weak=False)
            post_delete.connect(access_cache.on_access_change, sender=model, weak=False)
        m2m_changed.connect(access_cache.on_access_change, sender=links, weak=False)
