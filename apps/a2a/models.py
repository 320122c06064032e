"""A parked call of a remote A2A agent (apps.a2a.calls): the run waits on it as on a child.
The row exists iff the run is parked on the call (inserted in the parked step's commit) or
the call is being abandoned (its run ended first: `abandoned`, until the remote task is told)."""

from __future__ import annotations

from django.db import models


class A2ACall(models.Model):
    run_id = models.CharField(max_length=32)
    call_id = models.CharField(max_length=128)
    tool_name = models.CharField(max_length=256)
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    peer_def_id = models.CharField(max_length=32)  # the A2AAgentDef version called
    task_id = models.CharField(max_length=256)  # the remote task
    # The one credential the call sends (the peer's bearer_credential_ref), sealed to the run
    # (apps.runs.credentials.seal): the run's own credentials are erased when it ends.
    credentials_sealed = models.TextField(blank=True, default="")
    text = models.TextField(blank=True, default="")  # what the remote agent has said so far
    deadline = models.DateTimeField()
    wake_at = models.DateTimeField()  # when beat next asks the remote agent
    abandoned = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run_id", "call_id"], name="a2acall_run_call")]
        indexes = [models.Index(fields=["wake_at"], name="a2acall_wake_at")]
        verbose_name = "A2A call"

    def __str__(self) -> str:
        return f"{self.run_id}/{self.call_id} -> {self.task_id}"


class A2APushConfig(models.Model):
    """A push-notification config of an A2A task (a run): where the task is POSTed when the run ends.
    Written and read through apps.a2a.push.RunsPushConfigStore (the SDK's store interface)."""

    run_id = models.CharField(max_length=32)
    config_id = models.CharField(max_length=256)
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    url = models.URLField(max_length=2048)
    token = models.CharField(max_length=512, blank=True, default="")
    auth_scheme = models.CharField(max_length=64, blank=True, default="")
    auth_sealed = models.TextField(blank=True, default="")  # the credentials, sealed to the run
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run_id", "config_id"], name="a2apush_run_config")]
        verbose_name = "A2A push config"

    def __str__(self) -> str:
        return f"{self.run_id}/{self.config_id}"
