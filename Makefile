# Two commands for a new user: `make run` and `make test`. Everything else is for developers.
PYTHON ?= python3.12
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-needs test-faults test-sqlite soak bench lint format lock clean reference-servers oidc-provider fuzz-steering crewai-venv

# The developer's venv: requirements-dev.lock, the server with every framework extra and the test
# and lint tools. The image installs requirements.lock alone (the server), see the Dockerfile.
$(STAMP): requirements-dev.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.lock
	@# The project itself, editable and without dependencies (the lock has them): .venv/bin/stopdesk-mcp.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@touch $(STAMP)

venv: $(STAMP)

## Start stopdesk on the embedded default: SQLite, a local broker, the sandbox, demo data.
run: $(STAMP)
	$(PY) manage.py up

## The whole test suite: PostgreSQL and Redis on 127.0.0.1 when they answer. First installs what a
## registry gives (the venv; the CrewAI venv; the MCP reference servers, with npm), and names what it cannot.
test: test-needs
	$(PY) -m pytest $(PYTEST_ARGS)

## What the suite needs beyond the venv. Without npm or Chromium the tests that need them are
## skipped (with STOPDESK_REQUIRE_SERVICES=1, as in CI, they fail); one line says which and why.
CHROMIUM := /usr/bin/chromium
NPM := $(shell command -v npm)
test-needs: $(STAMP) crewai-venv $(if $(NPM),reference-servers oidc-provider)
	@test -n "$(NPM)" || \
		echo "make test: npm not found: the MCP reference-server and single sign-on tests will not run (apt-get install nodejs npm)"
	@test -x $(CHROMIUM) || \
		echo "make test: no Chromium at $(CHROMIUM): the browser tests will not run (apt-get install chromium)"

## Only the fault tests (also part of `make test`): real processes killed, PostgreSQL connections
## cut through a proxy, a broker and a watch server of their own stopped; each under a minute.
test-faults: $(STAMP)
	$(PY) -m pytest tests/faults -m faults -p no:logging -s $(PYTEST_ARGS)

## The ledger's writes on SQLite (the zero-setup run's database): the portable twins of the
## PostgreSQL statements. Everything here also runs on PostgreSQL in `make test`.
test-sqlite: $(STAMP)
	@mkdir -p var
	STOPDESK_REQUIRE_SERVICES=0 STOPDESK_EXPECT_DB=sqlite DATABASE_URL=sqlite:///$(CURDIR)/var/test-sqlite.sqlite3 \
		$(PY) -m pytest tests/ledger tests/layers tests/api/test_any_database.py -m "not postgres and not redis" $(PYTEST_ARGS)

## Nightly: the race and browser tests SOAK_N times (default 50), each run a fresh pytest; names
## each test that failed and how often, prints the flake count, and fails unless it is 0.
SOAK_N ?= 50
soak: $(STAMP)
	$(PY) -m tests.soak --runs $(SOAK_N) $(SOAK_TESTS)

## Benchmarks: one line per figure, `name value unit`, with the ratio to its target.
bench: $(STAMP)
	$(PY) -m bench

## The steering fuzzer at full length: 5,000 API requests with hostile declarations, and not one
## connection from the server to an address nobody configured (the CI run makes 600).
fuzz-steering: $(STAMP)
	STOPDESK_FUZZ_REQUESTS=5000 $(PY) -m pytest tests/api/test_fuzz_steering.py -s -q -p no:logging $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy stopdesk reconcile stopdrill
	$(VENV)/bin/lint-imports --no-cache

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

## Resolve requirements/*.in into requirements.lock (client and server: the image) and
## requirements-dev.lock (everything, for make test), keeping the old pins that still fit.
## `make lock UPGRADE=1` takes the newest versions the .in files allow.
lock:
	$(PYTHON) requirements/lock.py $(if $(UPGRADE),--upgrade)

## The official MCP reference servers the tests talk to: server-everything (npm, pinned in
## package-lock.json) and mcp-server-git (PyPI, in its own venv: it pins its own mcp).
REF := tests/reference_servers
reference-servers: $(REF)/node_modules/.installed $(REF)/git-venv/.installed

$(REF)/node_modules/.installed: $(REF)/package.json $(REF)/package-lock.json
	cd $(REF) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(REF)/git-venv/.installed: $(REF)/git-server.lock $(STAMP)
	@test -x $(REF)/git-venv/bin/python || $(PY) -m venv $(REF)/git-venv
	$(REF)/git-venv/bin/python -m pip install --quiet --disable-pip-version-check -r $(REF)/git-server.lock
	@touch $@

## The CrewAI agent side, in a venv of its own: no crewai release installs beside the server's
## pins (it needs mcp<2 and openai<3). Its agent talks to a stopdesk server over HTTP, so it needs
## only the client install with the crewai extra (requirements/crewai.in), pinned by its own lock.
CREWAI := tests/frameworks_venvs
crewai-venv: $(CREWAI)/crewai/.installed

$(CREWAI)/crewai/.installed: $(CREWAI)/crewai.lock
	@test -x $(CREWAI)/crewai/bin/python || $(PYTHON) -m venv $(CREWAI)/crewai
	$(CREWAI)/crewai/bin/python -m pip install --quiet --disable-pip-version-check -r $(CREWAI)/crewai.lock
	@# The project itself through its crewai extra, within the lock: the extra resolves, nothing moves.
	$(CREWAI)/crewai/bin/python -m pip install --quiet --disable-pip-version-check -c $(CREWAI)/crewai.lock -e ".[crewai]"
	@touch $@

## The OpenID Connect provider the single sign-on tests sign in through: node's oidc-provider
## (npm, pinned in package-lock.json).
OIDC := tests/oidc_provider
oidc-provider: $(OIDC)/node_modules/.installed

$(OIDC)/node_modules/.installed: $(OIDC)/package.json $(OIDC)/package-lock.json
	cd $(OIDC) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

clean:
	rm -rf var test-artifacts .pytest_cache
