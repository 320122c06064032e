"""The faults of issue 41 on a cluster of network namespaces (tests/netns_cluster.py), injected
while the infrastructure-restart workload (tests/chaos/infra_workload.py) runs through the
public API, and the recovery each one took. Used by the short run (tests/chaos/test_partitions.py,
`make test`) and the full one (bench/partitions.py, `make partitions`).

Each fault returns an `Outcome`: the runs it hit (in flight on the host it cut off) and, per run,
when it committed again: `during_s` for runs that moved on while the fault lasted (another worker
took them over once their lease expired), counted from the fault's start; `after_heal_s` for runs
that committed nothing until the heal, counted from the heal. Times are Postgres's clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from apps.gateway.fairness.config import RUNS_KEY, TENANT_KEY, USER_KEY
from tests.chaos import infra_workload as wl
from tests.chaos.harness import wait_until
from tests.netns_cluster import WEB_HOSTS, Cluster

RECOVERY_BOUND_S = 120.0  # a run that has not committed again this long after its fault fails the run


@dataclass
class Outcome:
    kind: str
    host: str
    affected: list[str] = field(default_factory=list)
    during_s: list[float] = field(default_factory=list)
    after_heal_s: list[float] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)

    def row(self) -> str:
        """One line of the figures: runs hit, and the slowest recovery of each kind."""
        during = f"{max(self.during_s):.1f} s" if self.during_s else "-"
        after = f"{max(self.after_heal_s):.1f} s" if self.after_heal_s else "-"
        extra = " ".join(f"{k}={v}" for k, v in self.detail.items())
        hit = f"runs hit {len(self.affected):>3}"
        return f"{self.kind:<34} {self.host:<6} {hit}  during {during:>8}  after heal {after:>8}  {extra}"


def db_now(c: Cluster) -> datetime:
    now: datetime = c.sql("SELECT now()")[0][0]
    return now


def leased_on(c: Cluster, host: str) -> list[str]:
    """Unfinished runs whose lease a worker of `host` holds (owner ids are host:pid:nonce)."""
    pids = c.worker_pids(host)
    if not pids:
        return []
    pattern = "|".join(str(p) for p in pids)
    rows = c.sql(
        "SELECT id FROM runs_run WHERE lease_owner ~ %s AND status NOT IN ('completed', 'failed', 'cancelled')",
        (f":({pattern}):",),
    )
    return [r for (r,) in rows]


def busiest(c: Cluster, hosts: list[str], timeout: float = 60) -> tuple[str, list[str]]:
    """The worker host holding the most leases, and those runs (waits, bounded, until one holds any)."""

    def pick() -> tuple[str, list[str]] | None:
        held = {h: leased_on(c, h) for h in hosts}
        host = max(held, key=lambda h: len(held[h]))
        return (host, held[host]) if held[host] else None

    found: tuple[str, list[str]] = wait_until(pick, timeout, "a worker host holding a lease", interval=0.1)
    return found


def _first_commit_after(c: Cluster, run_id: str, since: datetime) -> datetime | None:
    row = c.sql("SELECT min(created_at) FROM runs_runevent WHERE run_id = %s AND created_at > %s", (run_id, since))
    at: datetime | None = row[0][0]
    return at


def measure(c: Cluster, out: Outcome, at: datetime, healed: datetime) -> Outcome:
    """Each affected run's next commit: during the fault, or after the heal (bounded wait)."""
    print(f"{out.kind} on {out.host}: {len(out.affected)} runs hit, measuring", flush=True)
    for run_id in out.affected:
        first = _first_commit_after(c, run_id, at)
        if first is not None and first <= healed:
            out.during_s.append((first - at).total_seconds())
            continue
        nxt = wait_until(lambda r=run_id: _first_commit_after(c, r, healed), RECOVERY_BOUND_S, f"{run_id} moving on")
        out.after_heal_s.append((nxt - healed).total_seconds())
    return out


def hold(seconds: float) -> None:
    """The fault's length: the outage being simulated, not a wait for something to happen."""
    time.sleep(seconds)


# --- the faults ---------------------------------------------------------------------------------


def partition_worker(c: Cluster, hosts: list[str], peers: list[str], seconds: float) -> Outcome:
    """The busiest worker host cut off from `peers` (pg, redis or both) for `seconds`, then healed."""
    host, affected = busiest(c, hosts)
    out = Outcome(f"worker cut from {'+'.join(peers)}", host, affected, detail={"held_s": seconds})
    at = db_now(c)
    c.net.partition(host, peers)
    try:
        hold(seconds)
    finally:
        c.net.heal(host)
    return measure(c, out, at, db_now(c))


def lossy_workers(c: Cluster, hosts: list[str], percent: int, seconds: float) -> Outcome:
    """Every worker host loses `percent` % of its packets to and from Postgres and Redis."""
    affected = [r for h in hosts for r in leased_on(c, h)]
    out = Outcome(f"workers lose {percent}% to pg+redis", "all", affected, detail={"held_s": seconds})
    at = db_now(c)
    for host in hosts:
        c.net.loss(host, ["pg", "redis"], percent)
    try:
        hold(seconds)
    finally:
        for host in hosts:
            c.net.heal(host)
    return measure(c, out, at, db_now(c))


def web_cut_from_postgres(c: Cluster, web: str, bound_s: float) -> Outcome:
    """A web host cut off from Postgres answers 503 database_unavailable within `bound_s`, never a
    500 or a hang; after the heal, the time until it answers 200 again."""
    out = Outcome("web cut from pg", web)
    with c.http(web) as http:  # the web process has looked the bearer up: it trusts it a while, as in production
        assert _ok(http), f"{web} not serving before the fault"
    c.net.partition(web, ["pg"])
    try:
        with c.http(web, timeout=bound_s + 30) as http:
            for method, path, body in (("GET", "/v1/runs", None), ("POST", "/v1/runs", _echo())):
                t0 = time.monotonic()
                resp = http.request(method, path, json=body)
                took = time.monotonic() - t0
                code = _code(resp)
                out.detail[f"{method}_s"] = round(took, 1)
                out.detail[f"{method}_status"] = f"{resp.status_code}:{code}"
    finally:
        c.net.heal(web)
    t0 = time.monotonic()
    with c.http(web) as http:
        wait_until(lambda: _ok(http), RECOVERY_BOUND_S, f"{web} answering after the heal", interval=0.2)
    print(out.row(), flush=True)
    out.after_heal_s.append(time.monotonic() - t0)
    return out


def _code(resp: httpx.Response) -> str | None:
    """The machine-readable code of an error answer (None for a success or a body not JSON)."""
    try:
        return str(resp.json().get("code")) if resp.status_code >= 400 else None
    except ValueError:
        return None


def _echo() -> dict[str, Any]:
    return {"agent": "echo", "prompt": "hello", "user_id": "infra", "background": True}


def _ok(http: httpx.Client) -> bool:
    try:
        return http.get("/v1/runs", params={"limit": 1}).status_code == 200
    except httpx.HTTPError:
        return False


def lose_worker_host(c: Cluster, hosts: list[str], new: str) -> Outcome:
    """The busiest worker host lost whole (processes killed, namespace deleted); `new` added."""
    host, affected = busiest(c, hosts)
    out = Outcome("worker host lost", host, affected, detail={"replaced_by": new})
    at = db_now(c)
    c.lose_host(host)
    hosts.remove(host)
    c.net.add_host(new)
    c.start_worker(new)
    hosts.append(new)
    return measure(c, out, at, at)


def replace_redis(c: Cluster, hosts: list[str]) -> Outcome:
    """The Redis host's server killed and an empty one started on the same address."""
    affected = [r for h in hosts for r in leased_on(c, h)]
    affected += [r for (r,) in c.sql("SELECT id FROM runs_run WHERE status = 'queued'")]
    out = Outcome("redis replaced by an empty one", "redis", affected)
    at = db_now(c)
    c.kill_redis()
    c.start_redis()
    return measure(c, out, at, at)


def web_cut_from_redis(c: Cluster, w: wl.Workload, run_id: str, seconds: float) -> Outcome:
    """A stream follower on the second web host, which loses Redis and its client link: the
    follower re-attaches to the first web host with Last-Event-ID (its read timeout, 3 keepalives,
    tells the cut), which must carry on from its last seq; the contract check then wants every
    event once, in seq order (tests/chaos/infra_workload.py)."""
    web, other = WEB_HOSTS[1], WEB_HOSTS[0]
    follower = wl.SseFollower(c.url(web), run_id, headers=c.headers, alternates=[c.url(other)], read_timeout=6.0)
    follower.start()
    w.followers.append(follower)
    wait_until(lambda: follower.seqs, 60, "the follower's first event")
    out = Outcome("web cut from redis+clients", web, [run_id])
    at = db_now(c)
    before = len(follower.seqs)
    c.net.partition(web, ["redis"], clients=True)
    try:
        hold(seconds)
    finally:
        c.net.heal(web)
    out.detail["resumes"] = follower.resumes
    out.detail["seqs_from_other"] = follower.served_by[before:].count(c.url(other))
    return measure(c, out, at, db_now(c))


def slow_workers(c: Cluster, seconds: float) -> Outcome:
    """Every worker host's link to Postgres and Redis delays each chunk 200 ms ± 100 ms (the delay
    proxies of tests/netns_delay.py; this kernel has no netem) for `seconds`."""
    affected = [r for h in c.proxies for r in leased_on(c, h)]
    out = Outcome("workers delayed 200±100ms pg+redis", "all", affected, detail={"held_s": seconds})
    at = db_now(c)
    c.slow_links(True)
    try:
        hold(seconds)
    finally:
        c.slow_links(False)
    return measure(c, out, at, db_now(c))


# --- after the workload -----------------------------------------------------------------------


def slot_violations(c: Cluster, timeout: float = 30) -> list[str]:
    """No fairness slot held once every run ended (the sweeper frees a lost process's within a
    sweep), and no run left waiting for an admission slot (as bench/chaos_report.py checks)."""
    client = c.redis_socket()

    def held() -> list[str]:
        sets = [k.decode() for p in (USER_KEY, TENANT_KEY) for k in client.scan_iter(p + "*")]
        slots = [f"{k}: {client.zcard(k)}" for k in sets if client.zcard(k)]
        return slots + ([f"{RUNS_KEY}: {client.hlen(RUNS_KEY)}"] if client.hlen(RUNS_KEY) else [])

    try:
        wait_until(lambda: not held(), timeout, "fairness slots released", 0.5)
        out = []
    except TimeoutError:
        out = [f"fairness slots still held {timeout:.0f} s after every run ended: {held()[:5]}"]
    if n := c.sql("SELECT count(*) FROM runs_run WHERE status = 'waiting_slot'")[0][0]:
        out.append(f"{n} runs still waiting for an admission slot")
    return out


def add_slow(http: httpx.Client, w: wl.Workload, tag: str, n: int, sleep_ms: int) -> list[str]:
    """`n` more tool runs of the workload (same steps, side effects counted alike), each model turn
    `sleep_ms` long, so a fault finds them in flight."""
    start = len(w.tool_runs)
    for i in range(start, start + n):
        turns = [*wl._effects(f"{tag}{i}", w.steps, sleep_ms), {"text": "done"}]
        w.tool_runs.append(wl._post(http, "chaos", wl._script(turns)))
    return w.tool_runs[start:]
