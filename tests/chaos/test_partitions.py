"""A cluster across network namespaces keeps the engine's contract through network faults
(issue 41; the short run of `make partitions`, bench/partitions.py).

Seven hosts (tests/netns_cluster.py: Postgres, Redis, two web, three workers), each a network
namespace on one bridge, every process bound to its host's address and started as compose starts
it. While the infrastructure-restart workload (tool runs, parked parents, channel waiters,
interactive runs, Interruption asks, an SSE follower) runs through the public API:
- a worker host is cut off from Postgres and Redis for three leases, then healed: its runs finish
  on other workers, its late commits meet the fence;
- a web host cut off from Redis and from its clients: an SSE follower of a streamed run there
  re-attaches to the other web host with Last-Event-ID and sees every event once, in seq order;
- a web host cut off from Postgres answers 503 `database_unavailable` within a bound (never a 500
  or a hang), and serves again once healed;
- a whole worker host is lost (its processes killed, its namespace deleted) and a new one added.
Then the contract is checked through SQL (tests/chaos/infra_workload.py) and no fairness slot is
left held. Needs root, iproute2 and nftables (.ci/run installs nftables); skipped elsewhere.

Marked solo: seven hosts' processes on a loaded 2-core machine beside xdist's modules would make
the lease-expiry timings meaningless.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.chaos import infra_workload as wl
from tests.chaos import partitions as faults
from tests.netns_cluster import ENGINE_ENV, WORKER_HOSTS, Cluster, cluster

pytestmark = [pytest.mark.solo, pytest.mark.skipif(bool(netns.unavailable()), reason=netns.unavailable())]

LEASE_S = float(ENGINE_ENV["LOOMCYCLE_LEASE_SECONDS"])
WEB_BOUND_S = 40.0  # the database pool's wait (30 s, loomcycle_project/settings.py) and some slack
FAIRNESS = {
    "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER": "20",
    "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_TENANT": "100000",
    "LOOMCYCLE_MAX_CONCURRENT_RUNS": "48",
    "LOOMCYCLE_CHANNELS_LONGPOLL_CAP_MS": "600000",
}


@pytest.fixture(scope="module")
def hosts() -> Iterator[Cluster]:
    root = Path(os.environ["LOOMCYCLE_DATA_DIR"])
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="netns-", dir=root / "tmp"))
    try:
        with cluster(data, root / "infra-template", extra_env=FAIRNESS) as c:
            yield c
    finally:
        if not os.environ.get("NETNS_KEEP"):  # NETNS_KEEP=1 keeps the hosts' logs (data/logs) to read a failure
            shutil.rmtree(data, ignore_errors=True)


@pytest.mark.timeout(600)
def test_a_cluster_across_namespaces_keeps_its_contract_through_partitions_and_a_lost_host(hosts: Cluster) -> None:
    c, workers = hosts, list(WORKER_HOSTS)
    with c.http() as http:
        w = wl.workload_start(http, c, tag="np", tool_runs=4, steps=3, each=1)
        wl.wait_parked(c, w)
        faults.add_slow(http, w, "np", 4, sleep_ms=2500)
        cut = faults.partition_worker(c, workers, ["pg", "redis"], seconds=3 * LEASE_S)
        (followed,) = faults.add_slow(http, w, "np", 1, sleep_ms=4000)
        streamed = faults.web_cut_from_redis(c, w, followed, seconds=2 * LEASE_S)
        web = faults.web_cut_from_postgres(c, "web2", bound_s=WEB_BOUND_S)
        faults.add_slow(http, w, "np", 4, sleep_ms=2500)
        lost = faults.lose_worker_host(c, workers, "w4")
        wl.unpark(http, c, w)
        wl.finish(http, c, w, timeout=180)
        for outcome in (cut, streamed, web, lost):
            print(outcome.row())
        assert wl.contract_violations(c, w, "np") == []
        assert faults.slot_violations(c) == []
    assert web.detail["GET_status"] == web.detail["POST_status"] == "503:database_unavailable", web.detail
    assert max(web.detail["GET_s"], web.detail["POST_s"]) < WEB_BOUND_S, web.detail
    assert streamed.detail["resumes"] >= 1 and streamed.detail["seqs_from_other"] > 0, streamed.detail
    assert cut.affected and lost.affected  # each worker fault hit runs in flight
