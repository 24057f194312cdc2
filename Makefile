# The two commands of the README: `make run` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python

.PHONY: run test bootstrap lock stop clean lint typecheck bench bench-peer bench-cache test-fast test-load gpu-check-prepare backup restore test-containers

bootstrap:
	@deploy/bootstrap.sh

# deploy/requirements.lock: every dependency of every extra, pinned (docs/operations.md, "Dependencies").
# pip-compile reads pip's own configuration, so a local torch build pins as it installs.
lock: bootstrap
	.venv/bin/pip-compile -q --allow-unsafe --all-extras --strip-extras --no-emit-index-url \
		--no-emit-find-links -o deploy/requirements.lock pyproject.toml
	@sed -i 's|^#    pip-compile .*|#    make lock|' deploy/requirements.lock
	@# The extras name the project itself (tts-service[web]): it is installed editable, never from the lock.
	@sed -i '/^tts-service @ /,+1d' deploy/requirements.lock

run: bootstrap
	@$(PY) -m deploy.stack run

stop:
	@$(PY) -m deploy.stack stop

lint: bootstrap
	.venv/bin/ruff check webapp synth deploy tests manage.py
	.venv/bin/ruff format --check webapp synth deploy tests manage.py
	.venv/bin/lint-imports --no-cache
	TTS_LOG_TO_FILE=0 $(PY) manage.py makemigrations --check --dry-run -v 0 2>/dev/null

typecheck: bootstrap
	.venv/bin/mypy webapp synth deploy tests

test: bootstrap lint typecheck
	.venv/bin/pytest $(PYTEST_ARGS)
	tests/gpu/check.sh --device cpu

# Every overlay validated (validate-k8s), then the images (deploy/container/) built with podman and
# the rendered `local` overlay run with `podman kube play`: a real job through the web container, a
# worker container killed mid-job. Installs podman, runc, catatonit and debootstrap when missing
# (tests/containers/prepare.sh).
test-containers: bootstrap
	deploy/k8s/validate.sh
	tests/containers/prepare.sh
	.venv/bin/pytest -m containers tests/containers $(PYTEST_ARGS)

# The voice-upload flood tests alone (part of `make test` too): about 30 s.
test-load: bootstrap
	.venv/bin/pytest tests/e2e/test_upload_load.py $(PYTEST_ARGS)

# The unit tests without those marked slow (long-text memory checks), for quick
# iterations: well under two minutes. `make test` runs everything.
test-fast: bootstrap
	.venv/bin/pytest tests/unit -m "not slow" $(PYTEST_ARGS)

# The Kubernetes manifests: every overlay rendered (kubectl kustomize) and checked by kubernetes-validate,
# the CRD schemas in deploy/k8s/schemas, the project's rules and checkov (deploy/validate_k8s.py); the
# tools live in .venv-k8s, made on first use (deploy/k8s/validate.sh). About 10 s once installed.
.PHONY: validate-k8s
validate-k8s:
	deploy/k8s/validate.sh $(VALIDATE_ARGS)

# Files a GPU machine needs for tests/gpu/check.sh --prepared var/gpu-check: fp16 weights, phoneme ids,
# onnxruntime and CPU float32 references, Python 3.12 wheels (docs/gpu.md, "The GPU check"; ~54 MiB).
gpu-check-prepare: bootstrap
	$(PY) -m tests.gpu.prepare --out var/gpu-check

bench: bootstrap
	$(PY) -m tests.bench $(BENCH_ARGS)

# Side by side with Piper's own HTTP server (issue 15): writes its table into docs/performance.md.
bench-peer: bootstrap
	$(PY) -m tests.bench peer $(BENCH_ARGS)

# The sentence cache against Piper's own server on the same requests (issue 33): a repeated
# notification workload, a fully cached request, a re-render; writes its table into docs/performance.md.
bench-cache: bootstrap
	$(PY) -m tests.bench cache $(BENCH_ARGS)

# One archive of the database (a consistent pg_dump), the media its rows name and the key secrets,
# encrypted with age to TTS_BACKUP_RECIPIENTS (or a clear one with CLEAR=1), in TTS_BACKUP_DIR (default
# var/backups), the TTS_BACKUP_KEEP newest kept, never leaving less than TTS_BACKUP_MIN_FREE_BYTES free on
# that disk (deploy/backup.py); `make restore FILE=... IDENTITY=...` brings one back into a fresh var/.
backup: bootstrap
	@$(PY) -m deploy.backup backup $(if $(OUT),--out $(OUT)) $(if $(CLEAR),--clear)

restore: bootstrap
	@if [ -z "$(FILE)" ]; then echo "usage: make restore FILE=var/backups/tts-backup-....tar.gz.age IDENTITY=path/to/age-key"; exit 2; fi
	@$(PY) -m deploy.backup restore $(FILE) $(if $(IDENTITY),--identity $(IDENTITY))

clean:
	@if [ "$(CONFIRM)" = "1" ]; then \
		$(PY) -m deploy.stack stop >/dev/null 2>&1 || true; \
		rm -rf var; echo "removed var/"; \
	else \
		echo "make clean removes var/ (database, audio, keys): run 'make clean CONFIRM=1'"; \
	fi
