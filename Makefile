# skiplock: `make demo` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
APT_PACKAGES := postgresql-15 postgresql-15-pgtap libtap-parser-sourcehandler-pgtap-perl postgresql-15-plpgsql-check postgresql-15-cron libfaketime pgbouncer \
                chromium chromium-driver prometheus prometheus-postgres-exporter

.PHONY: demo test test-citus citus lint docs screenshots bench-web bench-scale bench bench-peers peers-packages profile revision release baseline check-schema system-packages venv venv-bench clean

## demo: a throwaway cluster (or DATABASE_URL), migrations, workers draining a pipeline, a summary
demo: venv
	$(PY) -m skiplock demo

## test: lint, then pgTAP (pg_prove) and pytest against a throwaway cluster; never DATABASE_URL (TEST_ARGS go to pytest)
test: system-packages venv
	$(PY) -m dev.testrun $(TEST_ARGS)

## test-citus: Citus scale-out tests on a coordinator + two workers; builds Citus from ../shared/citus/ when citus.so is absent
test-citus: venv
	$(PY) -m dev.citus $(TEST_ARGS)

## citus: build and install Citus from ../shared/citus/ when citus.so is absent (then `make test` runs its tests)
citus: venv
	$(PY) -m dev.citus --build-only

## lint: ruff (all Python) and mypy (skiplock/, dev/), as configured in pyproject.toml; `make test` runs it first
lint: venv
	$(PY) -m dev.lint

## docs: docs/reference.md from the catalog of a throwaway database migrated to head (skiplock docs)
docs: venv
	$(PY) -m skiplock docs --output docs/reference.md

## screenshots: docs/dashboard-overview.png and docs/dashboard-task.png, taken by the browser tests (tests/py/test_web.py)
screenshots: system-packages venv
	SKIPLOCK_SCREENSHOTS=$(CURDIR)/docs $(PY) -m pytest tests/py/test_web.py -q -n 0 -k screenshots

## bench-web: what the dashboard costs: each page's time, a live refresh's database time on a large queue, workers' throughput with it open (bench/web.py)
bench-web: venv
	$(PY) -m bench.web $(BENCH_WEB_ARGS)

## bench-scale: cost as the work grows: W1, W2, maintain and the views at 10 k-10 M live tasks, 1-100 k stages, 50 M history rows (bench/scale.py)
bench-scale: venv-bench
	$(PY) -m bench.scale $(BENCH_SCALE_ARGS)

## bench: pgbench workloads against the machine's own ceiling; writes bench/RESULTS.md; then what the dashboard costs, bench/WEB.md
bench: venv-bench
	$(PY) -m bench.run $(BENCH_ARGS)
	$(PY) -m bench.web --throughput 15 --pairs 6 --out bench/WEB.md $(BENCH_WEB_ARGS)

## bench-peers: skiplock beside Graphile Worker, Procrastinate and PgQ, one cluster, one run; writes bench/PEERS.md
# Through the worker libraries instead (skiplock's Python client, PgQueuer's QueueManager, Procrastinate's worker, no-op
# handlers): `make peers-packages venv-bench && .venv/bin/python -m bench.peers_libs`, its own section of bench/PEERS.md.
bench-peers: venv-bench peers-packages
	$(PY) -m bench.peers $(PEERS_ARGS)

# The peers, installed only when missing, into .peers/ (not committed): Graphile Worker from npm,
# Procrastinate and PgQueuer from PyPI (a venv of their own: their dependencies stay out of
# skiplock's), PgQ from Debian. Versions pinned to those bench/PEERS.md was measured with; the run records what it found.
# An apt install can upgrade postgresql-15 itself: a cluster running across it must be restarted.
PEERS_DIR := .peers
GRAPHILE_WORKER_VERSION := 0.17.3
PROCRASTINATE_VERSION := 3.10.0
PGQUEUER_VERSION := 1.6.0
peers-packages:
	@dpkg-query -W -f='$${Status}' postgresql-15-pgq3 2>/dev/null | grep -q "install ok installed" || { \
	    SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO="sudo"; \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15-pgq3 >/dev/null; }
	@grep -qs '"version": "$(GRAPHILE_WORKER_VERSION)"' $(PEERS_DIR)/node/node_modules/graphile-worker/package.json || { \
	    mkdir -p $(PEERS_DIR)/node && cd $(PEERS_DIR)/node && \
	    { [ -f package.json ] || echo '{"private": true}' > package.json; } && \
	    npm install --no-audit --no-fund --silent graphile-worker@$(GRAPHILE_WORKER_VERSION); }
	@$(PEERS_DIR)/venv/bin/python -c "import importlib.metadata as m; assert m.version('procrastinate') == '$(PROCRASTINATE_VERSION)'" 2>/dev/null || { \
	    python3 -m venv $(PEERS_DIR)/venv && \
	    $(PEERS_DIR)/venv/bin/pip install -q --disable-pip-version-check procrastinate==$(PROCRASTINATE_VERSION) 'psycopg[binary]'; }
	@$(PEERS_DIR)/venv/bin/python -c "import importlib.metadata as m; assert m.version('pgqueuer') == '$(PGQUEUER_VERSION)'" 2>/dev/null || { \
	    $(PEERS_DIR)/venv/bin/pip install -q --disable-pip-version-check pgqueuer==$(PGQUEUER_VERSION); }

## profile: where enqueue, take and finish spend their time, per function, statement and line (plprofiler)
profile: venv
	@dpkg-query -W -f='$${Status}' postgresql-15-plprofiler 2>/dev/null | grep -q "install ok installed" || { \
	    SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO="sudo"; \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15-plprofiler >/dev/null; }
	$(PY) -m bench.profile $(PROFILE_ARGS)

## revision: freeze what changed in schema/ into a new migration: make revision m="what changed"
revision: venv
	$(PY) -m dev.revision -m "$(m)"

## release: squash the revisions since the last release into one and record it: make release v=0.2.0 (dry=1: into a temporary copy)
release: venv
	$(PY) -m dev.revision --release "$(v)" $(if $(dry),--dry-run)

## baseline: rewrite the history as one revision generated from schema/ (refused once 0.1.0 is released)
baseline: venv
	$(PY) -m dev.revision --baseline

check-schema: venv
	$(PY) -m dev.revision --check

# Debian packages the tests need, installed only when missing (root, or sudo when not root).
# Node.js (for the Node client's tests) counts as present when node and npm are on PATH, whoever installed them.
system-packages:
	@missing=""; for p in $(APT_PACKAGES); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	command -v node >/dev/null && command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; \
	    SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO="sudo"; \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

# The benchmark also needs matplotlib (the chart): the `bench` extra, on top of the test venv.
venv-bench: $(VENV)/.installed-bench

$(VENV)/.installed-bench: $(VENV)/.installed
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	touch $@

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
