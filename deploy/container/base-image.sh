#!/usr/bin/env bash
# Builds the Dockerfile's base image from Debian's packages, for machines that reach an apt mirror
# but no container registry: debootstrap bookworm (minbase) + python3.11 with venv, imported into
# podman under the name the Dockerfile's FROM uses, so the Dockerfile builds unchanged.
#
#   deploy/container/base-image.sh [--force] [--tag NAME]
#
# The mirror is the one this machine's apt uses (/etc/apt/sources.list*), or TTS_APT_MIRROR.
# Where a registry is reachable this script is not needed: `python:3.11-slim-bookworm` is pulled.
set -euo pipefail

TAG=docker.io/library/python:3.11-slim-bookworm
FORCE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --force) FORCE=1 ;;
    --tag) TAG="$2"; shift ;;
    *) echo "usage: $0 [--force] [--tag NAME]" >&2; exit 2 ;;
  esac
  shift
done

if [ "$FORCE" = 0 ] && podman image exists "$TAG"; then
  echo "base-image: $TAG exists (--force rebuilds it)"
  exit 0
fi
[ "$(id -u)" -eq 0 ] || { echo "base-image: debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "base-image: debootstrap missing (apt-get install debootstrap)" >&2; exit 1; }

# The first Debian (not -security) URI this machine's apt is configured with: deb822 files first,
# then one-line sources. A mirror behind a proxy or a snapshot works the same way.
mirror_from_apt() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk '/^URIs:/ {print $2}' "$f" | grep -v -- '-security' | grep -i debian | head -n1 || true)
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; break}}' "$f" \
      | grep -v -- '-security' | grep -i debian | head -n1 || true)
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  echo http://deb.debian.org/debian
}
MIRROR=${TTS_APT_MIRROR:-$(mirror_from_apt)}
SECURITY=${TTS_APT_SECURITY_MIRROR:-${MIRROR%/debian}/debian-security}

work=$(mktemp -d /var/tmp/tts-base.XXXXXX)
# Kept on failure, for its logs (debootstrap/debootstrap.log inside the root).
trap 'rc=$?; if [ $rc -eq 0 ]; then rm -rf "$work"; else echo "base-image: failed; logs in $work" >&2; fi' EXIT
root=$work/rootfs
echo "base-image: debootstrap bookworm from $MIRROR"
# minbase: essential + apt, as Debian's own slim images. python3-venv brings ensurepip (pip's
# wheel), which the Dockerfile's `python3.11 -m venv` needs; ca-certificates for pip over TLS.
# python3-distutils is named because debootstrap's resolver skips the virtual package
# python3.11-distutils that python3.11-venv depends on (configuring it fails otherwise).
debootstrap --variant=minbase \
  --include=python3.11,python3,python3-venv,python3-distutils,python-is-python3,ca-certificates \
  bookworm "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 30 "$work/debootstrap.log" "$root/debootstrap/debootstrap.log" >&2; exit 1; }

# The same sources inside the image (with security updates), so the Dockerfile's apt-get works here.
cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
: >"$root/etc/apt/sources.list"
# As Debian's slim images: no documentation, manuals or translations in later installs, and apt
# keeps no package files.
cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
DPKG
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; };
APT::Install-Recommends "false";
APT
# Security updates now, so the base is what a fresh pull of the official image would be.
chroot "$root" /bin/sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -qq' \
  >"$work/upgrade.log" 2>&1 || { tail -n 30 "$work/upgrade.log" >&2; exit 1; }
find "$root/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete 2>/dev/null || true
rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
  "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* "$root"/tmp/* \
  "$root"/etc/machine-id "$root"/etc/hostname "$root"/etc/resolv.conf
# debootstrap leaves the host's name resolution in; podman mounts its own.

created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
tar --numeric-owner -C "$root" -c . | podman import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' \
  --change "LABEL org.opencontainers.image.created=$created" \
  --change 'LABEL org.opencontainers.image.description=Debian bookworm minbase with python3.11 (deploy/container/base-image.sh)' \
  --quiet --message "debootstrap bookworm from $MIRROR" - "$TAG" >/dev/null
echo "base-image: tagged $TAG ($(podman image inspect --format '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
