from django.apps import AppConfig


class AttemptsConfig(AppConfig):
    name = "attempts"
    verbose_name = "Ledger"

    def ready(self) -> None:
        from attempts import (  # noqa: F401  (checks registers system checks)
            chain,
            checks,
            config_history,  # records every authority change (signals)
            faults,
        )

        # Every checkpoint records the authority digest; the sealer is given how to compute it.
        chain.use_authority_digest(config_history.authority_digest)
        faults.check_environment()  # fault injection asked for in production: refuse to start
