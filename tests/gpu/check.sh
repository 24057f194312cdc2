#!/usr/bin/env bash
# GPU checks: the worker's GPU-memory reading and the PyTorch Piper engine.
#
#   tests/gpu/check.sh --device cpu   # in `make test`: the engine checks on the CPU, from the
#                                     # source tree with the project's venv, installing nothing
#   make gpu-check-prepare            # on a CPU machine: var/gpu-check/ (30 MiB, see tests/gpu/prepare.py)
#   tests/gpu/check.sh --prepared var/gpu-check [--device cuda:N]   # on a GPU machine; under 6 minutes
#
# A GPU machine needs only a copy of the working tree, the prepared folder and a Python
# with CUDA torch (piper-tts, onnx and the voice package are not needed there). It never
# installs torch (a multi-GB download); it installs nvidia-ml-py, Django, celery, psutil and numpy
# when missing (the memory readers and the model code need them). Checks, each printed as PASS/FAIL/SKIP:
#   engine (tests/gpu/engine_check.py): prepared fp16 weights load; fp32 durations equal
#      onnxruntime's; fp16 vs fp32 parity (CUDA); throughput at batch 1, 8, 32 and the
#      batch-8/batch-1 ratio; peak memory per job (torch.cuda.max_memory_allocated).
#   1. NVML per-process reading: allocate ~256 MiB on the GPU in this process; the
#      reader's figure rises by at least 200 MiB (NVML path: torch not imported yet).
#   2. torch path: with torch imported and CUDA initialised, the reader returns
#      torch.cuda.memory_reserved (within 1 MiB), and follows a 512 MiB allocation.
#   3. the recycle decision: with the engine's model loaded and a batch run, ChildHealth
#      with TTS_WORKER_MAX_GPU_MB just under the current reading asks for a recycle with
#      reason "gpu_memory".
#   4. reading never initialises CUDA: in a fresh process the reader on device "cuda"
#      leaves torch.cuda.is_initialized() False (the parent-process rule).
set -euo pipefail
cd "$(dirname "$0")/../.."

DEVICE=cuda:0
PREPARED=
while [[ $# -gt 0 ]]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --prepared) PREPARED=$(cd "$2" && pwd); shift 2 ;;
    *) echo "usage: tests/gpu/check.sh [--device cpu|cuda|cuda:N] [--prepared DIR]"; exit 2 ;;
  esac
done
[[ $DEVICE == cuda ]] && DEVICE=cuda:0

PY=${PY:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
deadline=$((SECONDS + 330))
engine_args=(--device "$DEVICE")
[[ -n $PREPARED ]] && engine_args+=(--prepared "$PREPARED")

if [[ $DEVICE == cpu ]]; then
  # The CUDA sections (memory readers, fp16, recycle) need a GPU; on the CPU the engine
  # checks prove the script and the prepared-files path.
  echo "SKIP: NVML and CUDA memory readers, recycle on GPU memory (--device cpu)"
  timeout 300 "$PY" tests/gpu/engine_check.py "${engine_args[@]}"
  exit $?
fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || {
  echo "FAIL: nvidia-smi not found: this script needs an NVIDIA GPU"; exit 1; }

if ! "$PY" -c "import pynvml" 2>/dev/null; then
  timeout 120 "$PY" -m pip install --quiet "nvidia-ml-py>=12" || { echo "FAIL: could not install nvidia-ml-py"; exit 1; }
fi

# A CUDA torch from the machine (the project's venv has the CPU build); allocations need one.
TORCH_PY="$PY"
if ! "$TORCH_PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  for candidate in python3 /usr/bin/python3 /opt/conda/bin/python; do
    if command -v "$candidate" >/dev/null && "$candidate" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
      TORCH_PY=$candidate; break
    fi
  done
fi
"$TORCH_PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || {
  echo "FAIL: no CUDA-enabled torch importable (tried $PY and the system python)"; exit 1; }
"$TORCH_PY" -c "import pynvml" 2>/dev/null || timeout 120 "$TORCH_PY" -m pip install --quiet "nvidia-ml-py>=12"

# The reader module needs Django settings only for defaults; run it standalone.
export DJANGO_SETTINGS_MODULE=webapp.settings TTS_LOG_TO_FILE=0 TTS_VAR_DIR="${TMPDIR:-/tmp}/tts-gpu-check"
export PYTHONPATH="$PWD${PREPARED:+:$PREPARED/pysrc}${PYTHONPATH:+:$PYTHONPATH}"
export TTS_WORKER_DEVICE=$DEVICE TTS_GPU_PREPARED=$PREPARED

if ! "$TORCH_PY" -c "import django, celery, psutil, numpy" 2>/dev/null; then
  timeout 120 "$TORCH_PY" -m pip install --quiet "Django>=5.2,<5.3" "celery[redis]>=5.6,<5.7" psutil numpy || {
    echo "FAIL: could not install the reader's dependencies"; exit 1; }
fi

status=0
run_check() {
  local name=$1; shift
  if (( SECONDS > deadline )); then echo "SKIP: $name (time budget spent)"; status=1; return; fi
  if timeout 120 "$TORCH_PY" - "$@"; then echo "PASS: $name"; else echo "FAIL: $name"; status=1; fi
}

if [[ -z $PREPARED ]]; then
  echo "FAIL: engine checks need --prepared DIR (make gpu-check-prepare on a CPU machine)"; status=1
elif (( SECONDS > deadline )); then
  echo "SKIP: engine checks (time budget spent)"; status=1
else
  timeout 240 "$TORCH_PY" tests/gpu/engine_check.py "${engine_args[@]}" || status=1
fi

run_check "NVML per-process reading follows an allocation" <<'EOF'
import ctypes, sys
import django; django.setup()
from webapp.speech import recycling
# Allocate through the CUDA runtime without torch, so only NVML can see it.
cudart = None
for name in ("libcudart.so", "libcudart.so.12", "libcudart.so.11.0"):
    try:
        cudart = ctypes.CDLL(name); break
    except OSError:
        pass
if cudart is None:
    import torch  # fall back: allocate with torch, then hide it from the torch path
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    before = None
    import pynvml
    from synth import telemetry
    after = telemetry.nvml_process_mb(0, __import__("os").getpid(), pynvml)
    print("nvml (torch allocation):", after)
    sys.exit(0 if after is not None and after >= 200 else 1)
ptr = ctypes.c_void_p()
cudart.cudaFree(0)  # create the context
before = recycling.read_gpu_memory_mb("cuda:0")
assert cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(256 * 2**20)) == 0
after = recycling.read_gpu_memory_mb("cuda:0")
print(f"nvml: before {before} MiB, after 256 MiB allocation {after} MiB")
sys.exit(0 if before is not None and after is not None and after - before >= 200 else 1)
EOF

run_check "torch path returns memory_reserved and follows it" <<'EOF'
import sys
import django; django.setup()
import torch
from webapp.speech import recycling
torch.cuda.init()
a = recycling.read_gpu_memory_mb("cuda:0")
x = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda:0")
b = recycling.read_gpu_memory_mb("cuda:0")
reserved = torch.cuda.memory_reserved(0) / 2**20
print(f"torch: before {a} MiB, after 512 MiB tensor {b} MiB, memory_reserved {reserved:.1f} MiB")
sys.exit(0 if b is not None and abs(b - reserved) < 1 and b - (a or 0) >= 500 else 1)
EOF

run_check "recycle decision on a real GPU reading" <<'EOF'
import os, sys
from pathlib import Path
import django; django.setup()
import torch
from webapp.speech import recycling
prepared = os.environ.get("TTS_GPU_PREPARED")
if prepared:  # the engine's own model and one batch hold the memory that trips the limit
    from synth.engines import vits_torch as vt
    import json
    model, _ = vt.load_prepared(str(Path(prepared) / "weights.pt"))
    vt.place(model, "cuda:0", torch.float16)
    ids = json.loads((Path(prepared) / "utterances.json").read_text())["phoneme_ids"]
    with torch.inference_mode():
        vt.infer(model, [vt.Utterance(row, 0.667, 1.0, 0.8) for row in ids], "cuda:0", torch.float16)
else:
    x = torch.empty(300 * 2**20, dtype=torch.uint8, device="cuda:0")
reader = lambda: recycling.read_gpu_memory_mb("cuda:0")
now = reader()
health = recycling.ChildHealth(recycling.RecyclePolicy(max_gpu_mb=max(1.0, now - 50)), gpu_reader=reader)
reason = health.check(rss_mb=1)
print("reading", now, "reason", reason)
sys.exit(0 if reason and reason.startswith("gpu_memory") else 1)
EOF

run_check "reading never initialises CUDA" <<'EOF'
import sys
import django; django.setup()
import torch  # imported, as a worker parent might have it, but CUDA not initialised
from webapp.speech import recycling
value = recycling.read_gpu_memory_mb("cuda:0")
print("reading without CUDA context:", value, "initialised:", torch.cuda.is_initialized())
sys.exit(0 if not torch.cuda.is_initialized() else 1)
EOF

echo "elapsed ${SECONDS}s"
exit $status
