"""Fair sharing of capacity across every web process and worker (SPEC 9.6), in Redis.

A slot is a member of a Redis sorted set scored by its expiry (ms on the Redis
clock, so the hosts' clocks never matter). Taking one is ONE Lua script:
prune the expired members, compare the count with the cap, add; two
processes can never both take the last slot. Releasing is ZREM: idempotent.

- Runs: every run takes a slot (member = its run id) in its user's and its
  tenant's set and gives it back when it finishes or is cancelled: a top-level
  run at admission (429 over a cap), a descendant (sub-agent, parallel_spawn
  child, resident child) when its parent's tool call plans it (over a cap, the
  call's is_error result; apps.runs.children.spawn), so fan-out never escapes the caps.
  Run slots live an hour; the beat sweeper (`run_slots_reconcile`) refreshes
  those of live runs and frees those of terminal or vanished runs, so a slot
  lost to a crash comes back within one sweep.
- Gateway calls hold a user (and tenant) slot for the call; provider calls
  hold a provider slot, waiting up to `provider_queue_timeout_ms`. Call
  slots live 30 s, refreshed by one heartbeat thread per process while held:
  a crashed process frees its calls within 30 s.
- A cap of 0 is off and costs no Redis round trip.

Keys: `lc:fair:u:<tenant>/<user>`, `lc:fair:t:<tenant>`, `lc:fair:p:<provider>`
(sorted sets of slots), `lc:fair:pw:<provider>` (callers waiting for one),
`lc:fair:runs` (hash run id -> "<taken_ms>\\n<key>..." naming the sets it
holds) and `lc:fair:keys` (the user/tenant sets in use, for the stats). One
Redis, not Redis Cluster: the scripts touch the keys the run hash names.
"""

from apps.gateway.fairness.config import Caps, FairnessUnavailable, SlotRefused, caps, provider_cap
from apps.gateway.fairness.slots import (
    Reconciled,
    acall_slot,
    aprovider_slot,
    call_slot,
    provider_caps,
    provider_slot,
    run_slot_release,
    run_slot_take,
    run_slots_reconcile,
    slots_stats,
)

__all__ = [
    "Caps",
    "FairnessUnavailable",
    "Reconciled",
    "SlotRefused",
    "acall_slot",
    "aprovider_slot",
    "call_slot",
    "caps",
    "provider_cap",
    "provider_caps",
    "provider_slot",
    "run_slot_release",
    "run_slot_take",
    "run_slots_reconcile",
    "slots_stats",
]
