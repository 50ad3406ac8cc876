PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_ARGS ?= --portfolios 6 --properties-per-portfolio 4 --records-per-property 400 --seed 42

.PHONY: demo test lint format venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements-dev.txt
	touch $@

# The demo runs on the embedded SQLite default and starts from a fresh file.
demo: venv
	rm -f var/db.sqlite3 var/db.sqlite3-wal var/db.sqlite3-shm
	DEBUG=true $(PY) manage.py migrate --noinput -v 0
	DEBUG=true $(PY) manage.py seed_demo $(DEMO_ARGS)
	DEBUG=true $(PY) manage.py cleanup_sweep --dry-run
	DEBUG=true $(PY) manage.py cleanup_sweep
	DEBUG=true $(PY) manage.py cleanup_drain
	@echo
	@echo "Admin: DEBUG=true $(PY) manage.py runserver, then open http://127.0.0.1:8000/admin/"

test: venv
	PYTHON=$(PY) bash scripts/test.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
