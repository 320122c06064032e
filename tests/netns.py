"""Hosts as Linux network namespaces on one machine (issue 41): the network half of the
partition harness (tests/netns_cluster.py starts the processes on it).

`Net` is a bridge inside a switch namespace of its own, and one namespace per host, each joined to
the bridge by a veth pair and given one address of a /24 in 198.18.0.0/15 (RFC 2544's benchmark
range: never a real network's). The root namespace (the test process, the workload's HTTP client)
joins the bridge through one more veth, so it reaches each host at the host's own address as a
client on another machine would; no host process ever binds the root namespace's loopback.

Faults are nftables rules inside a host's namespace (table `inet lc_fault`), both directions:
- `partition(host, peers)`: every packet to or from the peers' addresses dropped (a black hole:
  no reset, no ICMP; a peer's open connections hang, as across a cut link);
- `loss(host, peers, percent)`: each such packet dropped with that probability (nft numgen);
- `heal(host)`: the table deleted.
Delay (netem) is not offered here: this machine's kernel is built without sch_netem (no qdisc but
htb and pfifo), and nftables cannot hold a packet back; tests/netns_delay.py delays in user space.

Every name carries a run id (`lc<6 hex>`), and the /24 is one no route of the root namespace uses,
so a leftover of a crashed run never collides with a new one. `close()` kills every process left in
each namespace (`ip netns pids`: only processes this harness put there) and deletes the namespaces
(the bridge and every veth go with them); it runs every step even when one fails.
"""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

NET_RANGE = ipaddress.ip_network("198.18.0.0/15")
FAULT_TABLE = "lc_fault"


class NetnsUnavailable(RuntimeError):
    """This machine cannot build the harness (not root, or ip/nft missing): the reason."""


def unavailable() -> str:
    """Why the harness cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (iproute2, nftables: .ci/run installs them)"
    return ""


def run(*argv: str, input_text: str | None = None) -> str:
    """One iproute2/nft command; its stdout, or RuntimeError with its stderr."""
    done = subprocess.run(list(argv), input=input_text, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of NET_RANGE that no root-namespace route or address uses."""
    used = run("ip", "-4", "route", "show") + run("ip", "-4", "addr", "show")
    free = [s for s in NET_RANGE.subnets(new_prefix=24) if f"{str(s.network_address)[:-2]}." not in used]
    if not free:
        raise NetnsUnavailable(f"every /24 of {NET_RANGE} is in use")
    return random.choice(free[1:] or free)  # .0.0/24 left alone


@dataclass
class Host:
    name: str
    ns: str
    ip: str


@dataclass
class Net:
    """The switch, the hosts and the root namespace's port (module docstring)."""

    run_id: str = field(default_factory=lambda: "lc" + secrets.token_hex(3))
    subnet: ipaddress.IPv4Network = field(default_factory=_free_subnet)
    hosts: dict[str, Host] = field(default_factory=dict)
    _next: int = 10
    _up: bool = False

    @property
    def switch(self) -> str:
        return f"{self.run_id}-sw"

    @property
    def root_ip(self) -> str:
        return str(self.subnet.network_address + 1)

    def open(self) -> None:
        """The switch namespace with its bridge, and the root namespace's port on it."""
        run("ip", "netns", "add", self.switch)
        self._up = True
        run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.switch, "link", "set", "br0", "up")
        port = f"{self.run_id}r"
        run("ip", "link", "add", port, "type", "veth", "peer", "name", "root", "netns", self.switch)
        self._plug("root")
        run("ip", "addr", "add", f"{self.root_ip}/24", "dev", port)
        run("ip", "link", "set", port, "up")

    def _plug(self, port: str) -> None:
        run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
        run("ip", "-n", self.switch, "link", "set", port, "up")

    def add_host(self, name: str) -> Host:
        """A new namespace on the bridge with the next free address (never one used before)."""
        ns, ip = f"{self.run_id}-{name}", str(self.subnet.network_address + self._next)
        self._next += 1
        run("ip", "netns", "add", ns)
        host = Host(name, ns, ip)
        self.hosts[name] = host
        port = f"h{self._next - 1}"
        run("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
        self._plug(port)
        run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        return host

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run inside the host's namespace."""
        return ["ip", "netns", "exec", self.hosts[host].ns, *argv]

    def remove_host(self, name: str) -> None:
        """Kill every process in the host's namespace, then delete it (its veth goes with it)."""
        host = self.hosts.pop(name)
        _kill_all(host.ns)
        run("ip", "netns", "del", host.ns)

    # --- faults ------------------------------------------------------------------------------

    def _rules(self, host: str, peers: list[str], verdict: str, clients: bool = False) -> None:
        addrs = ", ".join([self.hosts[p].ip for p in peers] + ([self.root_ip] if clients else []))
        script = (
            f"table inet {FAULT_TABLE} {{\n"
            f"  chain out {{ type filter hook output priority 0; ip daddr {{ {addrs} }} {verdict}; }}\n"
            f"  chain in {{ type filter hook input priority 0; ip saddr {{ {addrs} }} {verdict}; }}\n"
            "}\n"
        )
        self.heal(host)
        run("ip", "netns", "exec", self.hosts[host].ns, "nft", "-f", "-", input_text=script)

    def partition(self, host: str, peers: list[str], clients: bool = False) -> None:
        """Drop every packet between `host` and each of `peers` (both ways); with `clients`, between
        it and the root namespace too (the workload's HTTP clients: a web host's client link)."""
        self._rules(host, peers, "drop", clients)

    def loss(self, host: str, peers: list[str], percent: int) -> None:
        """Drop `percent` % of the packets between `host` and each of `peers`, at random."""
        self._rules(host, peers, f"numgen random mod 100 < {percent} drop")

    def heal(self, host: str) -> None:
        ns = self.hosts[host].ns
        if FAULT_TABLE in run("ip", "netns", "exec", ns, "nft", "list", "tables"):
            run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", FAULT_TABLE)

    # --- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Every namespace of this run, its processes killed first; each step runs even when
        another failed, the first failure is raised."""
        failure: BaseException | None = None
        if self._up:  # the root namespace's port: its route goes now, not when the kernel reaps the switch
            try:
                run("ip", "link", "del", f"{self.run_id}r")
            except BaseException as exc:
                failure = exc
        for ns in [*(h.ns for h in self.hosts.values()), *([self.switch] if self._up else [])]:
            try:
                _kill_all(ns)
                run("ip", "netns", "del", ns)
            except BaseException as exc:
                failure = failure or exc
        self.hosts.clear()
        self._up = False
        if failure is not None:
            raise failure


def _kill_all(ns: str) -> None:
    """SIGKILL every process inside namespace `ns` (only this harness starts processes there)."""
    for pid in run("ip", "netns", "pids", ns).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
