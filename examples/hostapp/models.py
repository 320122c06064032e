from django.db import models


class Note(models.Model):
    """A note belonging to one end user (`owner` is the run's user_id) in one tenant."""

    tenant_id = models.CharField(max_length=128, default="")
    owner = models.CharField(max_length=128)
    text = models.TextField()

    class Meta:
        indexes = [models.Index(fields=["tenant_id", "owner"])]


class FinishedRun(models.Model):
    """One row per `run_finished` transition: the signal is at least once, so the receiver
    dedupes on its `delivery_id` (unique here)."""

    delivery_id = models.BigIntegerField(unique=True, null=True)  # null only on rows recorded before 0002
    run_id = models.CharField(max_length=64)
    status = models.CharField(max_length=32)
    recorded_at = models.DateTimeField(auto_now_add=True)
