#!/usr/bin/env bash
# make test-containers, first half: podman, runc, catatonit (podman's pause binary) and debootstrap
# from Debian's packages when missing (as root; otherwise it prints the apt-get line), then the
# base image and the images the `local` overlay names (deploy/container/build.sh), each timed.
# The timings go to stdout and var/containers/timings.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
missing=()
for pkg in podman runc catatonit debootstrap; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "Missing packages. Run this, then make test-containers again:"
    echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}"
    exit 1
  fi
  t=$(date +%s)
  echo "test-containers: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "timing: packages $(( $(date +%s) - t ))s"
fi
mkdir -p var/containers
# The tag the local overlay gives the images (deploy/k8s/overlays/local).
TTS_IMAGE_TAG=${TTS_IMAGE_TAG:-0.1.0-local} deploy/container/build.sh web worker analysis edge \
  | tee var/containers/timings.txt
