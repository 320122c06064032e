"""`make partitions` (issue 41): the full network-fault run on a cluster of network namespaces.

Seven hosts (tests/netns_cluster.py) and, while the infrastructure-restart workload
(tests/chaos/infra_workload.py) runs through the public API, every fault of
tests/chaos/partitions.py in turn: a worker host cut off from Postgres, from Redis, from both
(each three leases long), a web host cut off from Redis and from its clients (a stream follower
there re-attaches to the other web host with Last-Event-ID and carries on from its last seq) and
from Postgres (503 within a bound), 20 % packet loss between every worker and Postgres/Redis for a
minute, a delay of 200 ms ± 100 ms on every chunk between every worker and Postgres/Redis for a
minute (a user-space proxy on each worker host, tests/netns_delay.py: this kernel has no netem), a
worker host lost whole and a new one added, and the Redis host replaced by an empty Redis on the
same address. Then the contract through SQL and the fairness slots; prints one line per fault
(runs hit, the slowest recovery during the fault and after its heal) and exits non-zero on any
violation.

Needs root, iproute2 and nftables. PARTITIONS_RUNS sets the workload's tool runs (default 12),
PARTITIONS_LOSS_S and PARTITIONS_DELAY_S the lossy and slow links' length (60 s each).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import stack  # noqa: E402

DATA = ROOT / ".loomcycle" / "partitions"
# This process reads the cluster out of band (tests/netns_cluster.py) and needs no servers of its
# own: URLs that name none keep bench.stack from starting the embedded ones (each host's process
# gets the cluster's URLs).
stack.boot(DATA, load=False, instant_mock=False, DATABASE_URL="postgresql://unused@/unused", REDIS_URL="redis://unused")

from tests import netns  # noqa: E402
from tests.chaos import infra_workload as wl  # noqa: E402
from tests.chaos import partitions as faults  # noqa: E402
from tests.netns_cluster import ENGINE_ENV, WEB_HOSTS, WORKER_HOSTS, Cluster, cluster  # noqa: E402

RUNS = int(os.environ.get("PARTITIONS_RUNS", "12"))
LEASE_S = float(ENGINE_ENV["LOOMCYCLE_LEASE_SECONDS"])
LOSS_S = float(os.environ.get("PARTITIONS_LOSS_S", "60"))
DELAY_S = float(os.environ.get("PARTITIONS_DELAY_S", "60"))
WEB_BOUND_S = 40.0
FAIRNESS = {
    "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER": "40",
    "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_TENANT": "100000",
    "LOOMCYCLE_MAX_CONCURRENT_RUNS": "64",
    "LOOMCYCLE_CHANNELS_LONGPOLL_CAP_MS": "600000",
}


def faults_run(c: Cluster) -> tuple[list[faults.Outcome], list[str]]:
    workers = list(WORKER_HOSTS)
    out: list[faults.Outcome] = []
    with c.http() as http:
        w = wl.workload_start(http, c, tag="bp", tool_runs=RUNS, steps=3, each=2)
        wl.wait_parked(c, w, timeout=120)
        for peers in (["pg"], ["redis"], ["pg", "redis"]):
            faults.add_slow(http, w, "bp", 4, sleep_ms=2500)
            out.append(faults.partition_worker(c, workers, peers, seconds=3 * LEASE_S))
        (followed,) = faults.add_slow(http, w, "bp", 1, sleep_ms=4000)
        out.append(faults.web_cut_from_redis(c, w, followed, seconds=3 * LEASE_S))
        out.append(faults.web_cut_from_postgres(c, WEB_HOSTS[1], bound_s=WEB_BOUND_S))
        faults.add_slow(http, w, "bp", 6, sleep_ms=4000)
        out.append(faults.lossy_workers(c, workers, 20, seconds=LOSS_S))
        faults.add_slow(http, w, "bp", 6, sleep_ms=4000)
        out.append(faults.slow_workers(c, seconds=DELAY_S))
        faults.add_slow(http, w, "bp", 4, sleep_ms=2500)
        out.append(faults.lose_worker_host(c, workers, "w4"))
        faults.add_slow(http, w, "bp", 4, sleep_ms=2500)
        out.append(faults.replace_redis(c, workers))
        wl.unpark(http, c, w)
        wl.finish(http, c, w, timeout=300)
        broken = wl.contract_violations(c, w, "bp") + faults.slot_violations(c)
    streamed = next(o for o in out if o.kind.startswith("web cut from redis"))
    if not streamed.detail["seqs_from_other"]:
        broken.append(f"web cut from redis: the follower never read from the other web host {streamed.detail}")
    web = next(o for o in out if o.kind == "web cut from pg")
    for method in ("GET", "POST"):
        if web.detail[f"{method}_status"] != "503:database_unavailable" or web.detail[f"{method}_s"] >= WEB_BOUND_S:
            broken.append(f"web cut from pg: {method} answered {web.detail}")
    return out, broken


def main() -> int:
    if why := netns.unavailable():
        print(f"make partitions: {why}", file=sys.stderr)
        return 2
    DATA.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="run-", dir=DATA))
    t0 = time.monotonic()
    try:
        with cluster(data, DATA / "template", extra_env=FAIRNESS, delay_proxy=True) as c:
            print(f"cluster up in {time.monotonic() - t0:.0f} s on {c.net.subnet}", flush=True)
            outcomes, broken = faults_run(c)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    print(f"\n{os.uname().nodename}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for outcome in outcomes:
        print(outcome.row())
    print("contract:", "held" if not broken else "BROKEN")
    for line in broken:
        print("  " + line)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
