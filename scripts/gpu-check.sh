#!/usr/bin/env bash
# GPU check (docs/metrics.md, "GPU memory"): on a machine with an NVIDIA GPU and this project installed
# (.venv), print nvidia-smi, what NVML sees through harness.probe.gpu, and sample once with this process's pid,
# first alone, then holding a CUDA context (libcuda through ctypes) so the per-process figure is exercised.
# Exit 0 when NVML sampled every GPU, 1 otherwise.   Usage: bash scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-.venv/bin/python}

echo "== nvidia-smi"
if command -v nvidia-smi >/dev/null; then nvidia-smi || echo "nvidia-smi failed (rc $?)"; else echo "nvidia-smi: not found"; fi

echo "== NVML through harness.probe.gpu"
"$PY" -c '
import ctypes, json, os, sys
from harness.probe.gpu import MIB, GpuMeter, process_tree
with GpuMeter() as meter:
    print("available:", meter.available, "| why:", meter.why)
    if not meter.available:
        sys.exit(1)
    me = process_tree(os.getpid())
    s = meter.sample(me)
    for d in s.devices:
        print(f"GPU {d.index} {d.name}: {d.used_bytes / MIB:,.0f} of {d.total_bytes / MIB:,.0f} MiB used")
    print("this process, no CUDA context:", s.process_bytes, "|", s.process_why)
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        print("libcuda not loadable, per-process path not exercised:", exc)
    else:
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        rc = [cuda.cuInit(0), cuda.cuDeviceGet(ctypes.byref(dev), 0), cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)]
        s = meter.sample(me)
        mib = "n/a" if s.process_bytes is None else f"{s.process_bytes / MIB:,.0f} MiB"
        print("this process, with a CUDA context (cuda rc", rc, "):", mib, "|", s.process_why)
        if ctx.value:
            cuda.cuCtxDestroy_v2(ctx)
    print(json.dumps(s.to_dict(), indent=1))
    sys.exit(0 if s.available else 1)
'
