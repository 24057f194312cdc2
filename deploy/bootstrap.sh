#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian/Ubuntu machine:
# system packages (as root, or prints the apt-get line), then .venv with every extra.
set -euo pipefail
cd "$(dirname "$0")/.."

# TTS_BOOTSTRAP_PACKAGES overrides the list (tests use it).
read -r -a PACKAGES <<< "${TTS_BOOTSTRAP_PACKAGES:-postgresql redis-server nginx-light openssl iproute2 procps flite chromium bubblewrap age}"
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# npm fetches axe-core below; Node from another source may already bring it.
[ -n "${TTS_BOOTSTRAP_PACKAGES:-}" ] || command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "Missing system packages. Run this, then run make again:"
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The browser tests' accessibility checker (tests/e2e/assets/, not committed).
AXE=tests/e2e/assets/axe.min.js
if [ ! -s "$AXE" ] && command -v npm >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack -q axe-core@4.10.3 >/dev/null && tar -xzf axe-core-4.10.3.tgz package/axe.min.js)
  mkdir -p "$(dirname "$AXE")" && mv "$tmp/package/axe.min.js" "$AXE" && rm -rf "$tmp"
fi
# Debian starts the packaged services; the project runs its own instances.
for svc in postgresql redis-server nginx; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" || true
  fi
done

# Whether a user with no rights of its own can run this Python (deploy/privileges.py).
others_can_run() {
  "$1" -c 'import sys; from pathlib import Path; from deploy.privileges import others_can_use
sys.exit(0 if others_can_use(Path(sys.executable).resolve()) else 1)' 2>/dev/null
}
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3.11
  command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
  # As root, `make run` runs gunicorn and Celery as an unprivileged user, who must be able to run
  # .venv's Python. One under a private folder (pyenv's under /root) cannot be run by it: then
  # .venv is built on the system's python3.11, where there is one with venv support.
  if [ ! -x .venv/bin/python ] && [ "$(id -u)" -eq 0 ] && ! others_can_run "$PYTHON" \
     && [ -x /usr/bin/python3.11 ] && others_can_run /usr/bin/python3.11 \
     && /usr/bin/python3.11 -c 'import ensurepip, venv' 2>/dev/null; then
    echo "bootstrap: $PYTHON is in a folder other users cannot enter; .venv uses /usr/bin/python3.11"
    PYTHON=/usr/bin/python3.11
  fi
fi
stamp=.venv/.installed
# Every dependency of every extra, bench included (`make bench-peer` runs Piper's own server from
# this install), at the versions deploy/requirements.lock pins (`make lock` refreshes it); then the project
# itself, editable, without resolving again. The stamp holds the lock's and pyproject.toml's hashes: a
# new lock installs again, and a changed pyproject.toml (its entry points: the engines) the project.
LOCK=deploy/requirements.lock
# Packages installed without their declared requirements (voxcpm: docs/engines.md, "VoxCPM").
NODEPS=deploy/requirements-nodeps.lock
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
want="$(cat "$LOCK" "$NODEPS" pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing $LOCK and the project into .venv"
  .venv/bin/pip install -q -r "$LOCK"
  .venv/bin/pip install -q --no-deps -r "$NODEPS"
  .venv/bin/pip install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
