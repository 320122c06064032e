"""Queue names and routing (DESIGN.md: `runs` for iterations, `maintenance` for sweeps)."""

RUNS = "runs"
MAINTENANCE = "maintenance"

# The run engine's doorbell task. Postgres (the run's lease and the sweeper) is
# what makes an iteration durable, not the message: workers/transport.py keeps
# no Redis unacked copy of these.
ITERATE_TASK = "runs.iterate"
DOORBELL_TASKS = frozenset({ITERATE_TASK})

TASK_ROUTES = {
    "runs.*": {"queue": RUNS},
    "maintenance.*": {"queue": MAINTENANCE},
    "channels.*": {"queue": MAINTENANCE},  # wake-ups of parked waits: small, frequent, never behind iterations
}
