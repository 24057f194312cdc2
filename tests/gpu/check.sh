#!/usr/bin/env bash
# The GPU check: the PyTorch Piper engine and synth.telemetry's GPU-memory readers, engine level only
# (no Django, Celery, Redis or PostgreSQL; the worker's recycling on GPU memory stays tested on the CPU).
#
#   tests/gpu/check.sh --device cpu   # in `make test`: every section on small workloads, from the source
#                                     # tree with the project's venv; installs and downloads nothing
#   make gpu-check-prepare            # on a CPU machine: var/gpu-check/ (~54 MiB, tests/gpu/prepare.py)
#   tests/gpu/check.sh --prepared var/gpu-check --device cuda:0 --out "$OUT"   # on the GPU machine
#
# The GPU machine needs a copy of the working tree, the prepared folder and a Python with CUDA torch.
# The packages the check needs besides torch (numpy, nvidia-ml-py, psutil; voxcpm and its missing imports
# for the VoxCPM section, tests/gpu/voxcpm_check.py) come as Python 3.12 wheels
# in the prepared folder; those that Python lacks are installed from there into a temporary folder
# (pip --no-index, or unpacked where it has no pip): no registry, never torch. Results: results.json
# (every figure, written as each section ends) and check.log (this output) in --out (default $OUT;
# else a new folder under /tmp). The whole run has a deadline (--budget-s, default 240 s on CUDA),
# well under the 5 minutes that leave room for a second run. Sections: tests/gpu/engine_check.py.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

DEVICE=cuda:0
PREPARED=
RESULTS=${OUT:-}
BUDGET=
while [[ $# -gt 0 ]]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --prepared) PREPARED=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --out) RESULTS=$2; shift 2 ;;
    --budget-s) BUDGET=$2; shift 2 ;;
    *) echo "usage: tests/gpu/check.sh [--device cpu|cuda|cuda:N] [--prepared DIR] [--out DIR] [--budget-s S]"
       exit 2 ;;
  esac
done
[[ $DEVICE == cuda ]] && DEVICE=cuda:0
[[ -n $RESULTS ]] || RESULTS=$(mktemp -d "${TMPDIR:-/tmp}/tts-gpu-check.XXXXXX")
mkdir -p "$RESULTS" && RESULTS=$(cd "$RESULTS" && pwd)
# CPU: make test's time; CUDA: under 5 minutes in all, start-up and installs included.
[[ -n $BUDGET ]] || if [[ $DEVICE == cpu ]]; then BUDGET=300; else BUDGET=240; fi

main() {
  local started=$SECONDS
  echo "gpu check: device $DEVICE, prepared ${PREPARED:-(made now)}, results in $RESULTS, budget ${BUDGET}s"
  date -u +"started %Y-%m-%dT%H:%M:%SZ"

  # A Python with torch: $PY, else the project's venv on the CPU, else the machine's (CUDA torch).
  local describe='import sys; print(sys.version.split()[0], end=" ")
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
except Exception as exc:
    print("no torch:", type(exc).__name__, exc)'
  local py= found= candidates=(python3.12 python3 python /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python)
  [[ $DEVICE == cpu ]] && candidates=(.venv/bin/python "${candidates[@]}")
  [[ -n ${PY:-} ]] && candidates=("$PY")
  for candidate in "${candidates[@]}"; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    found=$(timeout 60 "$candidate" -c "$describe" 2>/dev/null)
    if [[ $found == *" torch "* && ( $DEVICE == cpu || $found == *"available True"* ) ]]; then
      py=$candidate; break
    fi
    echo "python candidate $candidate: ${found:-did not answer}"
  done
  if [[ -z $py ]]; then
    echo "FAIL: no Python whose torch can run on $DEVICE (set PY=...)"; return 1
  fi
  echo "python: $py ($found)"
  if [[ $DEVICE == cuda* ]]; then
    if command -v nvidia-smi >/dev/null 2>&1; then
      nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
    else
      echo "nvidia-smi: not found"
    fi
  fi

  local site=
  export PYTHONPATH="$PWD${PREPARED:+:$PREPARED/pysrc}${PYTHONPATH:+:$PYTHONPATH}"
  if [[ -n $PREPARED && -d $PREPARED/wheels ]]; then
    site=$(mktemp -d "${TMPDIR:-/tmp}/tts-gpu-check-site.XXXXXX")
    timeout 120 "$py" tests/gpu/wheels.py --wheels "$PREPARED/wheels" --target "$site" || {
      echo "FAIL: could not install the carried wheels"; return 1; }
    export PYTHONPATH="$PYTHONPATH:$site"
  fi

  local left=$((BUDGET - (SECONDS - started)))
  (( left > 60 )) || { echo "FAIL: ${left}s left of the ${BUDGET}s budget before the engine check"; return 1; }
  local engine_args=(--device "$DEVICE" --out "$RESULTS" --budget-s $((left - 15)))
  [[ -n $PREPARED ]] && engine_args+=(--prepared "$PREPARED")
  local status=0
  timeout -k 5 "$((left - 5))" "$py" tests/gpu/engine_check.py "${engine_args[@]}" || status=$?
  (( status == 124 || status == 137 )) && echo "FAIL: engine check stopped at the deadline (results.json keeps what it had)"
  [[ -n $site ]] && rm -rf "$site"
  echo "elapsed $((SECONDS - started))s"
  return $status
}

main 2>&1 | tee "$RESULTS/check.log"
status=${PIPESTATUS[0]}
echo "results in $RESULTS: $(cd "$RESULTS" && ls)"
exit "$status"
