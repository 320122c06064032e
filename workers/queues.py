"""Queue names and routing (DESIGN.md: `runs` for iterations, `maintenance` for sweeps)."""

RUNS = "runs"
MAINTENANCE = "maintenance"

TASK_ROUTES = {
    "runs.*": {"queue": RUNS},
    "maintenance.*": {"queue": MAINTENANCE},
    "channels.*": {"queue": MAINTENANCE},  # wake-ups of parked waits: small, frequent, never behind iterations
}
