"""Evaluations (SPEC 6.6, 9.6): one immutable score of one run, keyed by
`eval_id`, with the evaluated run's pinned agent definition denormalised
(`def_id`) so a definition's scores aggregate without joining runs. Rows are
written once by apps.evaluations.services and never updated: a database
trigger (migration 0001) refuses every UPDATE."""

from __future__ import annotations

from django.db import models


class EmitterRole(models.TextChoices):
    """Who scored the run, relative to it (derived server-side, never from input)."""

    EXTERNAL = "external", "external"  # no agent: an operator or API client
    SELF = "self", "self"  # the evaluated run scored itself
    PARENT = "parent", "parent"  # an ancestor run scored its descendant
    UNRELATED = "unrelated", "unrelated"  # anyone else (siblings included)


class Evaluation(models.Model):
    eval_id = models.CharField(primary_key=True, max_length=32)  # eval_<16hex> (ev_<16hex> before 2026-11-28)
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    run_id = models.CharField(max_length=32)  # the evaluated run
    def_id = models.CharField(max_length=64)  # the evaluated run's pinned agent_def id
    agent_name = models.CharField(max_length=128)  # the evaluated run's agent
    score = models.FloatField()
    dimensions = models.JSONField(default=dict, blank=True)  # {axis: number}, optional per-axis scores
    judgement = models.TextField(blank=True, default="")
    rationale = models.TextField(blank=True, default="")
    emitter_role = models.CharField(max_length=16, choices=EmitterRole.choices)
    evaluator_run_id = models.CharField(max_length=32, blank=True, default="")
    evaluator_agent_name = models.CharField(max_length=128, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(score__gte=0.0, score__lte=1.0), name="evaluation_score_0_1"),
        ]
        indexes = [
            models.Index(fields=["tenant_id", "run_id", "created_at"], name="evaluation_run"),
            models.Index(fields=["tenant_id", "def_id", "created_at"], name="evaluation_def"),
            models.Index(fields=["tenant_id", "agent_name", "created_at"], name="evaluation_agent"),
        ]
        ordering = ["-created_at", "eval_id"]

    def __str__(self) -> str:
        return f"{self.eval_id} {self.run_id}={self.score}"
