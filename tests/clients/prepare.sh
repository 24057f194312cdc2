#!/usr/bin/env bash
# The agent clients' virtualenv (.venv-clients) from tests/clients/requirements.lock, made once and
# again only when the lock changes. The dialect tests run each client as a process of this
# interpreter; the tests' session fixture calls this script, so `pytest` alone needs nothing more.
set -euo pipefail
cd "$(dirname "$0")/../.."
LOCK=tests/clients/requirements.lock
VENV=.venv-clients
stamp="$VENV/.lock-sha256"
want="$(sha256sum "$LOCK" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
PYTHON=python3.11
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
echo "tests/clients: installing $LOCK into $VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -r "$LOCK"
echo "$want" > "$stamp"
