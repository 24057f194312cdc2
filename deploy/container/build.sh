#!/usr/bin/env bash
# Builds the images with podman from the repository root (deploy/container/README.md):
#   deploy/container/build.sh [TARGET...]     (default: web worker analysis edge)
# TTS_IMAGE_PREFIX (default localhost/tts-) and TTS_IMAGE_TAG (default dev) name them:
# localhost/tts-web:dev, ... The base image is built from Debian's packages first when no
# registry gives it (base-image.sh). pip inside the build sees this machine's indexes
# (pip_config.py). Each image's build time goes to stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=${TTS_IMAGE_PREFIX:-localhost/tts-}
TAG=${TTS_IMAGE_TAG:-dev}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(web worker analysis edge)
PYTHON=${PYTHON:-python3}

t0=$(date +%s)
deploy/container/base-image.sh
echo "timing: base $(( $(date +%s) - t0 ))s"

pipdir=$(mktemp -d /var/tmp/tts-pip.XXXXXX)
trap 'rm -rf "$pipdir"' EXIT
mapfile -t PIP_ARGS < <("$PYTHON" deploy/container/pip_config.py "$pipdir")

for target in "${TARGETS[@]}"; do
  t=$(date +%s)
  # --network host: the build's RUN steps reach the indexes without a bridge or addresses
  # outside this machine's own; --layers: the venv stages are reused while the lock is unchanged.
  podman build --network host --layers --pull=never \
    --ignorefile deploy/container/Dockerfile.dockerignore \
    "${PIP_ARGS[@]}" \
    --label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
    -f deploy/container/Dockerfile --target "$target" -t "$PREFIX$target:$TAG" . \
    > "$pipdir/build-$target.log" 2>&1 \
    || { tail -n 40 "$pipdir/build-$target.log" >&2; echo "build.sh: $target failed" >&2; exit 1; }
  size=$(podman image inspect --format '{{.Size}}' "$PREFIX$target:$TAG" | awk '{printf "%.0f MB", $1/1e6}')
  echo "timing: $target $(( $(date +%s) - t ))s ($size)"
done
