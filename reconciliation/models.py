"""Worker bookkeeping. The ledger itself lives in ``attempts``."""

from django.db import models


class WorkerHeartbeat(models.Model):
    """One row per reconcile worker: /healthz reads how fresh the newest one is."""

    worker_id = models.CharField(max_length=100, unique=True)
    hostname = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField(db_index=True)
    settled_total = models.PositiveBigIntegerField(default=0)
    lookups_total = models.PositiveBigIntegerField(default=0)
    # Set by a supervisor that restarted this worker after its predecessor died (scripts/run):
    # how many times, and how the last one ended. /healthz shows both.
    restarts = models.PositiveIntegerField(default=0)
    last_exit = models.CharField(max_length=200, blank=True, default="")
    # The providers this worker finds degraded (breaker open or half-open, holding for
    # Retry-After, failing), by provider: /healthz and /metrics show them.
    providers = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return self.worker_id
