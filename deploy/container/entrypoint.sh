#!/bin/sh
# The Django images' entry point for a plain `podman run` / `docker run`: create the folders under
# TTS_VAR_DIR, as the systemd units' ExecStartPre does (manage.py prepare_var), then run the command.
# The Kubernetes manifests name their command, which replaces this, and run prepare_var as an
# init container. A secret whose variable (or *_FILE) is unset is made in this container's own
# volume: fine for one container, wrong for replicas, which must share it (the Secret).
set -eu
python /app/manage.py prepare_var >/dev/null
exec "$@"
