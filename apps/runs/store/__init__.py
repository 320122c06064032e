"""The one package that writes the runs app's tables (`runs_*`): run rows,
their events, transcript, inputs, tool-call records and the runtime state.
Other modules, and other apps, call the functions here (writes) or
apps.runs.selectors (reads); tests/test_architecture.py checks it.

- `append`: the append primitive. Every event or transcript row is appended
  in the statement that updates (or inserts) the run row, numbered from the
  counters that very row returns; the claim, the step commit, an answer to a
  parked call, a cancel and run creation all use it, so seqs stay
  consecutive, without duplicates, whichever of them races.
- `hot`: the engine's two writes per iteration (claim, step commit, which
  records the tool calls and arms the next step's lease), prepared statements on pooled connections.
- `adopt`: the one plain SELECT that adopts an armed lease instead of the claim.
- `control`: run creation, heartbeat, answers, cancel, input, pause/resume,
  sweeps, the child report, an operator's retry of a failed run.
- `admission`: the backpressure lock, count, promotion and withdrawal.
- `outbox`: the lifecycle signals' outbox (insert, delete, the re-send claim).
- `snapshot`: a snapshot's runs restored (insert-or-ignore) and resumed.
- `fanout`: a parallel_spawn / runs:batch join and its slots (insert, count a report, start a waiting child).
- `interrupts`: the Interruption.ask rows (insert, lock, the one move out of `pending`).
- `compaction`: a compaction request queued as a RunInput row of its own source.
- `sessions`: the session decision lock, an enqueued run's promotion, the rollback mark, a replay's seed.
- `turncancel`: the turn-cancel flag of an interactive run (set; the step commit clears it).
- `resident`: the resident children's rows (insert, lock, waiting call, read cursor, close).
- `webhooks`: completion webhooks (attach, the delivery row of an end or park, claim, settle); imported
  as `apps.runs.store.webhooks`, not re-exported.

Every public name is re-exported here: `store.X` and
`from apps.runs.store import X` are the interface.
"""

from apps.runs.store.admission import admission_lock_and_count, waiting_promote, waiting_withdraw
from apps.runs.store.adopt import adopt
from apps.runs.store.budget import budget_waiting_spenders, budget_waiting_wake
from apps.runs.store.compaction import CompactQueued, compact_request_queue
from apps.runs.store.control import (
    AnswerTarget,
    InputQueued,
    answer_append,
    answer_lock,
    cancel,
    child_report_claim,
    input_queue,
    insert_run,
    leases_extend,
    retry_failed,
    runs_pause_unleased,
    runs_resume_paused,
    runs_stale_release,
    runtime_state_lock,
    runtime_state_set,
)
from apps.runs.store.fanout import (
    Counted,
    fanout_child_claim,
    fanout_count,
    fanout_insert,
    fanout_lock,
    fanout_start_next,
)
from apps.runs.store.hot import (
    PARKED_STATUSES,
    ClaimedRun,
    StepRows,
    Switched,
    _hot,
    _prepared,
    claim,
    claim_hand_back,
    commit_step,
    pending_inputs,
    pool_purge,
)
from apps.runs.store.interrupts import interrupt_finish, interrupt_insert, interrupt_lock
from apps.runs.store.outbox import outbox_claim_due, outbox_delete, outbox_insert
from apps.runs.store.resident import (
    resident_close,
    resident_insert,
    resident_lock,
    resident_read,
    resident_touch,
    resident_waiter_clear,
    resident_waiter_set,
)
from apps.runs.store.sessions import (
    seed_finish,
    session_cancel_mark,
    session_lock,
    session_promote,
    session_rollback_mark,
)
from apps.runs.store.snapshot import RunRowsWritten, run_restore, runs_resume_restored
from apps.runs.store.turncancel import turn_cancel_request

__all__ = [
    "PARKED_STATUSES",
    "AnswerTarget",
    "ClaimedRun",
    "CompactQueued",
    "Counted",
    "InputQueued",
    "RunRowsWritten",
    "StepRows",
    "Switched",
    "_hot",
    "_prepared",
    "admission_lock_and_count",
    "adopt",
    "answer_append",
    "answer_lock",
    "budget_waiting_spenders",
    "budget_waiting_wake",
    "cancel",
    "child_report_claim",
    "claim",
    "claim_hand_back",
    "commit_step",
    "compact_request_queue",
    "fanout_child_claim",
    "fanout_count",
    "fanout_insert",
    "fanout_lock",
    "fanout_start_next",
    "input_queue",
    "insert_run",
    "interrupt_finish",
    "interrupt_insert",
    "interrupt_lock",
    "leases_extend",
    "outbox_claim_due",
    "outbox_delete",
    "outbox_insert",
    "pending_inputs",
    "pool_purge",
    "resident_close",
    "resident_insert",
    "resident_lock",
    "resident_read",
    "resident_touch",
    "resident_waiter_clear",
    "resident_waiter_set",
    "retry_failed",
    "run_restore",
    "runs_pause_unleased",
    "runs_resume_paused",
    "runs_resume_restored",
    "runs_stale_release",
    "runtime_state_lock",
    "runtime_state_set",
    "seed_finish",
    "session_cancel_mark",
    "session_lock",
    "session_promote",
    "session_rollback_mark",
    "turn_cancel_request",
    "waiting_promote",
    "waiting_withdraw",
]
