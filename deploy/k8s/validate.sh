#!/usr/bin/env bash
# make validate-k8s: render every overlay of deploy/k8s and check it (deploy/validate_k8s.py).
# The tools live in their own venv, .venv-k8s (deploy/k8s/requirements.txt), made here when missing
# or when the pins changed. --tools-only: only that.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${TTS_K8S_VENV:-.venv-k8s}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if ! [ -x "$VENV/bin/python" ] || ! cmp -s deploy/k8s/requirements.txt "$VENV/.requirements"; then
  echo "validate-k8s: installing the validators into $VENV" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  echo '*' >"$VENV/.gitignore"  # the venv ignores itself: no entry in the project's .gitignore
  "$VENV/bin/pip" install -q -r deploy/k8s/requirements.txt
  cp deploy/k8s/requirements.txt "$VENV/.requirements"
fi
if [ "${1:-}" = "--tools-only" ]; then
  exit 0
fi
exec "$VENV/bin/python" -m deploy.validate_k8s --tools "$VENV/bin" "$@"
