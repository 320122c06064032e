"""A run as an A2A Task (the SDK's protobuf types): a task is a run, its id the run's id,
its context the run's session, and its state the run's status (STATE below). The task's
artifact is the run's last assistant text once it has completed; a failed run's status
message is its error; an input-required task's message is the question it waits on."""

from __future__ import annotations

from dataclasses import dataclass

from a2a.types import Artifact, Message, Part, Role, Task, TaskState, TaskStatus, TaskStatusUpdateEvent

from apps.runs.models import RunStatus

RESPONSE_ARTIFACT = "response"

STATE: dict[str, TaskState] = {
    RunStatus.QUEUED: TaskState.TASK_STATE_SUBMITTED,
    RunStatus.WAITING_SLOT: TaskState.TASK_STATE_SUBMITTED,
    RunStatus.WAITING_SESSION: TaskState.TASK_STATE_SUBMITTED,
    RunStatus.WAITING_BUDGET: TaskState.TASK_STATE_SUBMITTED,
    RunStatus.RUNNING: TaskState.TASK_STATE_WORKING,
    RunStatus.WAITING_CHILDREN: TaskState.TASK_STATE_WORKING,
    RunStatus.WAITING_CHANNEL: TaskState.TASK_STATE_WORKING,
    RunStatus.WAITING_FANOUT: TaskState.TASK_STATE_WORKING,
    RunStatus.PAUSED: TaskState.TASK_STATE_WORKING,
    RunStatus.AWAITING_INPUT: TaskState.TASK_STATE_INPUT_REQUIRED,
    RunStatus.AWAITING_INTERRUPT: TaskState.TASK_STATE_INPUT_REQUIRED,
    RunStatus.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    RunStatus.FAILED: TaskState.TASK_STATE_FAILED,
    RunStatus.CANCELLED: TaskState.TASK_STATE_CANCELED,
}
# Where a blocking message/send returns and a stream ends: the task waits on its caller or is over.
WAITING = frozenset({RunStatus.AWAITING_INPUT, RunStatus.AWAITING_INTERRUPT})
SETTLED = WAITING | {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}


@dataclass(frozen=True)
class RunView:
    """What a task is made of, read in one place (apps.a2a.runs.run_view)."""

    run_id: str
    session_id: str
    status: str
    last_seq: int
    agent_name: str
    final_text: str
    error: str
    question: str


def agent_message(view: RunView, text: str) -> Message:
    return Message(
        message_id=f"{view.run_id}-{view.status}",
        context_id=view.session_id,
        task_id=view.run_id,
        role=Role.ROLE_AGENT,
        parts=[Part(text=text)],
    )


def task_status(view: RunView) -> TaskStatus:
    status = TaskStatus(state=STATE.get(view.status, TaskState.TASK_STATE_WORKING))
    texts: dict[str, str] = {
        RunStatus.FAILED: view.error or "the run failed",
        RunStatus.CANCELLED: view.error or "cancelled",
        RunStatus.AWAITING_INTERRUPT: view.question,
        RunStatus.AWAITING_INPUT: view.final_text,
        RunStatus.COMPLETED: view.final_text,
    }
    text = texts.get(view.status, "")
    if text:
        status.message.CopyFrom(agent_message(view, text))
    status.timestamp.GetCurrentTime()
    return status


def task(view: RunView) -> Task:
    out = Task(id=view.run_id, context_id=view.session_id, status=task_status(view))
    out.metadata.update({"agent": view.agent_name, "run_status": view.status})
    if view.status == RunStatus.COMPLETED and view.final_text:
        out.artifacts.append(
            Artifact(artifact_id=RESPONSE_ARTIFACT, name="response", parts=[Part(text=view.final_text)])
        )
    return out


def status_event(view: RunView) -> TaskStatusUpdateEvent:
    return TaskStatusUpdateEvent(task_id=view.run_id, context_id=view.session_id, status=task_status(view))
