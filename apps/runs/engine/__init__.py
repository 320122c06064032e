"""The engine wing: one agent-loop iteration per Celery task (docs/architecture.md).
iterate (claim, hand-back, settle) -> step (control, compaction, model call, tool phase)
-> commit (the fenced commit and its after-commit work). The tasks and tests call these."""

from apps.runs.engine.iterate import HAND_BACKS_FREE as HAND_BACKS_FREE
from apps.runs.engine.iterate import Outcome as Outcome
from apps.runs.engine.iterate import run_iterate as run_iterate
