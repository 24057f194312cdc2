# The two commands of the README: `make run` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python

.PHONY: run test bootstrap stop clean lint typecheck bench test-fast

bootstrap:
	@deploy/bootstrap.sh

run: bootstrap
	@$(PY) -m deploy.stack run

stop:
	@$(PY) -m deploy.stack stop

lint: bootstrap
	.venv/bin/ruff check webapp synth deploy tests manage.py
	.venv/bin/ruff format --check webapp synth deploy tests manage.py
	TTS_LOG_TO_FILE=0 TTS_VAR_DIR=var/lint $(PY) manage.py makemigrations --check --dry-run -v 0 2>/dev/null

typecheck: bootstrap
	.venv/bin/mypy webapp synth deploy

test: bootstrap lint typecheck
	.venv/bin/pytest $(PYTEST_ARGS)

# Everything but the slow end-to-end and reliability suites, for quick iterations.
test-fast: bootstrap
	.venv/bin/pytest tests/unit $(PYTEST_ARGS)

bench: bootstrap
	$(PY) -m tests.bench $(BENCH_ARGS)

clean:
	@if [ "$(CONFIRM)" = "1" ]; then \
		$(PY) -m deploy.stack stop >/dev/null 2>&1 || true; \
		rm -rf var; echo "removed var/"; \
	else \
		echo "make clean removes var/ (database, audio, keys): run 'make clean CONFIRM=1'"; \
	fi
