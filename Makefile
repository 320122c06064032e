# One command each: `make run` (the runtime on the embedded default) and
# `make test` (the whole suite). Both create and reuse .venv from requirements/: `make run`
# installs what running needs (base + embedded servers + the protoc that generates the gRPC
# stubs), `make test` adds the test tools (dev.txt). Each first-run step announces itself and,
# failing, says which step and why (loomcycle_project/steps.py; full output in .loomcycle/setup.log).
# `LOOMCYCLE_SCHEDULER_ENABLED=1 make run` also fires ScheduleDefs (docs/triggers.md).
VENV  := .venv
PY    := $(VENV)/bin/python
RUN_REQS := requirements/base.txt requirements/embedded.txt requirements/build.txt
# The client's pyproject too: its editable install is where the `loomcycle` script and the testing
# kit's pytest11 entry point come from, and pip writes those only when it installs.
CLIENT_PROJECT := loomcycle_http/pyproject.toml
RUN_STAMP := $(VENV)/.run-$(shell cat $(RUN_REQS) $(CLIENT_PROJECT) | sha256sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(shell cat $(RUN_REQS) requirements/dev.txt | sha256sum | cut -c1-12)
STEP := python3 loomcycle_project/steps.py
PIP := $(PY) -m pip install --disable-pip-version-check

.PHONY: proto run test lint typecheck bench bench-peer bench-live bench-infra bench-gateway bench-webhooks bench-schedules bench-interrupts bench-fanout bench-triggers bench-circuit bench-grpc rolling-deploy capacity soak chaos partitions doctor venv clean

# The gRPC stubs (apps/grpcapi, docs/grpc.md): generated from the project's .proto by grpcio-tools'
# protoc, never committed (.gitignore); every target that runs code depends on them.
PROTO     := apps/grpcapi/proto/loomcycle.proto
PROTO_GEN := apps/grpcapi/proto/loomcycle_pb2.py

venv: $(STAMP) $(PROTO_GEN)

proto: $(PROTO_GEN)

$(PROTO_GEN): $(PROTO) $(RUN_STAMP)
	@$(STEP) "generating the gRPC stubs (grpcio-tools' protoc)" -- $(PY) -m apps.grpcapi.stubs

# Running: base + embedded servers + build (protoc), and the `loomcycle` command.
$(RUN_STAMP): $(RUN_REQS) $(CLIENT_PROJECT)
	@test -x $(PY) || $(STEP) "creating the virtualenv $(VENV) (python3 -m venv)" -- python3 -m venv $(VENV)
	@$(STEP) "installing the runtime's requirements into $(VENV) (base, embedded Postgres and Valkey; a minute on a first run)" -- \
	  $(PIP) $(foreach r,$(RUN_REQS),-r $(r))
	@# .venv/bin/loomcycle: the client-only distribution, editable (docs/cli.md); it also registers
	@# the testing kit's pytest11 entry point (loomcycle_http.testing: loading it starts nothing).
	@# Not the root project: that would shadow this checkout's apps.
	@$(STEP) "installing the loomcycle command (./loomcycle_http, editable)" -- $(PIP) --no-deps -e ./loomcycle_http
	@# A .venv made before the rename: its editable `loomcycle-client` would shadow PyPI's `loomcycle`.
	@if $(PY) -m pip show --quiet loomcycle-client 2>/dev/null; then $(PY) -m pip uninstall --quiet -y loomcycle-client; fi
	@rm -f $(VENV)/.run-*
	@touch $(RUN_STAMP)

# Testing: the above plus the test, lint and type-check tools.
$(STAMP): $(RUN_STAMP) requirements/dev.txt
	@$(STEP) "installing the test tools into $(VENV) (requirements/dev.txt)" -- $(PIP) -r requirements/dev.txt
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

run: $(RUN_STAMP) $(PROTO_GEN)
	$(PY) manage.py up

doctor: $(RUN_STAMP) $(PROTO_GEN)
	$(PY) manage.py doctor

# TEST_WORKERS pytest-xdist workers (0: one process), each with its own embedded Postgres,
# Redis, Celery workers and web (docs/architecture.md, "The test suite"); --dist loadfile
# keeps each module, and the processes its module-scoped fixtures start, on one worker; the
# modules are handed out longest first (tests/order.py: xdist's own reorder is off).
# Tests marked `solo` (wall-clock sensitive: the two-beat fast-clock test) then run alone, in one
# process, after the parallel part. Exit status: a failing part's; 5 ("no tests collected") only
# when neither part collected a test.
TEST_WORKERS ?= 2

test: $(STAMP) $(PROTO_GEN)
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not solo" $(PYTEST_ARGS); main=$$?; \
	$(PY) -m pytest -m solo $(PYTEST_ARGS); solo=$$?; \
	for rc in $$main $$solo; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done; \
	if [ $$main -eq 5 ] && [ $$solo -eq 5 ]; then exit 5; fi; exit 0

lint: $(STAMP) $(PROTO_GEN)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP) $(PROTO_GEN)
	$(PY) -m mypy apps workers loomcycle_project loomcycle_http

bench: $(STAMP)
	$(PY) bench/loop.py
	$(PY) bench/fanout.py
	$(PY) bench/interrupts.py
	$(PY) bench/live_tokens.py

# Live tokens: provider chunk -> SSE client at 1 and 100 concurrent streaming runs (bench/live_tokens.py).
bench-live: $(STAMP)
	$(PY) bench/live_tokens.py

bench-gateway: $(STAMP)
	$(PY) bench/gateway.py

bench-webhooks: $(STAMP)
	$(PY) bench/webhooks.py

bench-schedules: $(STAMP)
	$(PY) bench/schedules.py

bench-interrupts: $(STAMP)
	$(PY) bench/interrupts.py

# gRPC against HTTP on the stack `make run` starts: a unary read and time to first event (bench/grpc_vs_http.py).
bench-grpc: $(STAMP) $(PROTO_GEN)
	$(PY) bench/grpc_vs_http.py

bench-fanout: $(STAMP)
	$(PY) bench/fanout.py

# Rolling deploy under load (issue 25, docs/reliability.md "Rolling deploy"): RUNS runs mid-flight
# while a newer checkout (changed tool description, expand migration) is migrated live, its
# workers started and the old ones warm-stopped. Knobs: RUNS; ROLLING_LATENCY_MS (2000),
# ROLLING_CONCURRENCY (64), ROLLING_DEPLOY_AT (0.05), ROLLING_WAVE2 (0.6),
# ROLLING_DEADLINE_S (1200) from the environment.
rolling-deploy: RUNS ?= 500
rolling-deploy: $(STAMP)
	ROLLING_RUNS=$(RUNS) $(PY) bench/rolling.py

# Infrastructure restarts (issue 25): Redis restarted with its data lost, then Postgres restarted,
# each under a mixed workload; docs/reliability.md. Knobs: INFRA_RUNS (tool runs per fault), INFRA_EACH
# (runs of each parked kind), INFRA_PG_DOWN_S (seconds Postgres stays down), INFRA_WORKERS.
INFRA_RUNS ?= 24
INFRA_EACH ?= 4
INFRA_PG_DOWN_S ?= 3
INFRA_WORKERS ?= 2
bench-infra: $(STAMP)
	INFRA_RUNS=$(INFRA_RUNS) INFRA_EACH=$(INFRA_EACH) INFRA_PG_DOWN_S=$(INFRA_PG_DOWN_S) \
	  INFRA_WORKERS=$(INFRA_WORKERS) $(PY) bench/infra_restarts.py

# The soak (docs/reliability.md, "Soak"): the stack as `make run` starts it, under a steady mixed
# load through the API for DURATION seconds; knobs SOAK_RATE, SOAK_WORKERS, ... (bench/soak.py).
DURATION ?= 300

soak: $(STAMP)
	SOAK_DURATION=$(DURATION) $(PY) bench/soak.py

# Both trigger benches (issue 19): webhook deliveries end to end, then schedule fire lag.
bench-triggers: bench-webhooks bench-schedules

# Capacity (issue 25; docs/reliability.md, "Capacity"): in-call, parked and cancel on the stack
# `make run` starts. SUITE=all|incall|parked|cancel; scale knobs are CAPACITY_* variables (bench/capacity.py),
# e.g. `make capacity SUITE=parked CAPACITY_PARKED_RUNS=20000`.
SUITE ?= all

capacity: $(STAMP)
	CAPACITY_SUITE=$(SUITE) $(PY) bench/capacity.py

# Sizing (issue 41; docs/operations.md, "From one machine to many"): per process kind, RSS and
# Postgres connections idle and with runs in their call, Redis bytes per queued doorbell and per
# parked run, on capacity's stack. Knobs: SIZING_INCALL_RUNS, SIZING_INCALL_MS, SIZING_PARKED_RUNS.
.PHONY: sizing
sizing: $(STAMP)
	$(PY) bench/sizing.py

# The circuit bench, with its LangGraph peer in a separate venv (.venv-peer).
PEER_STAMP := .venv-peer/.installed-$(shell sha256sum requirements/bench-peer.txt | cut -c1-12)

$(PEER_STAMP): requirements/bench-peer.txt
	test -x .venv-peer/bin/python || python3 -m venv .venv-peer
	.venv-peer/bin/python -m pip install --quiet --disable-pip-version-check -r requirements/bench-peer.txt
	rm -f .venv-peer/.installed-*
	touch $(PEER_STAMP)

bench-circuit: $(STAMP) $(PEER_STAMP)
	$(PY) bench/circuit.py

# The engine, its floor and LangGraph + AsyncPostgresSaver (bench/langgraph_loop.py, .venv-peer) on the
# same workload, alternated in one spell (bench/peer.py; docs/performance.md, "The peer").
bench-peer: $(STAMP) $(PEER_STAMP)
	$(PY) bench/peer.py

# The large chaos run (issue 25, docs/reliability.md): N runs (60: about a minute; N=1000 is the
# published run, >= 100 worker kills) under every fault kind, SEED for the RNG (random, printed).
N ?= 60
chaos: $(STAMP)
	CHAOS_N=$(N) $(if $(SEED),CHAOS_SEED=$(SEED)) $(PY) bench/chaos.py

# The network-fault run (issue 41, docs/reliability.md, "Network partitions"): seven hosts as network
# namespaces (needs root, iproute2, nftables), every partition, loss and host-loss fault in turn while
# the mixed workload runs; prints one line per fault and the contract. `make test` runs a short version.
partitions: $(STAMP) $(PROTO_GEN)
	$(PY) bench/partitions.py

clean:
	rm -rf .loomcycle/test .pytest_cache .mypy_cache .ruff_cache
