#!/bin/sh
# Runs inside the Dockerfile's build stages: installs the core and the extras named ("web",
# "worker analysis", ...) into /opt/venv at the versions deploy/requirements.lock pins, wheels only.
# pip sees the host's indexes when the build passes them (deploy/container/pip_config.py):
# /run/secrets/pip.conf names the CA bundle, the constraints and the local indexes under
# /run/pip-local. Without them (a build elsewhere) pip uses PyPI as usual.
#   TTS_WHEELS     a folder of wheels built in the build (the lock's sdist-only packages)
#   TTS_TORCH=cuda the lock's CPU torch pin is replaced by the same release from the index
#                  (PyPI's Linux torch is the CUDA build; worker-gpu)
set -eu
build=/opt/tts-build
[ -f /run/secrets/pip.conf ] && export PIP_CONFIG_FILE=/run/secrets/pip.conf
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
lock=$build/requirements.lock
if [ "${TTS_TORCH:-cpu}" = cuda ]; then
  version=$(sed -n 's/^torch==\([0-9.]*\)+cpu$/\1/p' "$lock")
  grep -v '^torch==' "$lock" > /tmp/lock.cuda
  echo "torch==$version" >> /tmp/lock.cuda
  lock=/tmp/lock.cuda
fi
python3 "$build/requirements.py" "$build/pyproject.toml" "$@" > /tmp/requirements.txt
# srt (the captions' library) is pure Python published as an sdist only: pip builds it here (no
# compiler involved); every other package comes as a wheel.
/opt/venv/bin/pip install --only-binary=:all: --no-binary=srt ${TTS_WHEELS:+--find-links "$TTS_WHEELS"} \
  -c "$lock" -r /tmp/requirements.txt
# The voxcpm extra: the package itself without its declared requirements (gradio, funasr,
# modelscope, datasets, torchaudio, torchcodec...: its demo, training and hub code, never imported).
case " $* " in
  *" voxcpm "*) /opt/venv/bin/pip install --only-binary=:all: --no-deps -r "$build/requirements-nodeps.lock" ;;
esac
rm -f /tmp/requirements.txt /tmp/lock.cuda
