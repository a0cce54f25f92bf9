#!/usr/bin/env bash
# Everything stepscope checks on a real NVIDIA GPU, in one run of a few minutes; the figures of
# docs/benchmarks.md's "Real GPU" section come from it.
#
#   OUT=/tmp/gpu-run bash benchmarks/gpu_run.sh
#
# Writes under $OUT (default ./gpu-run): summary.txt (also printed at the end) and results.tar.gz
# (every step's log, the gpu_check JSON files, the diagnoses and kernel tables). It runs from the
# source tree with PYTHONPATH, no install: pinned wheels the machine lacks (msgspec, isal) are
# installed from .whl/ when that folder is there. Each step has its own time limit and a failed
# step does not stop the others. Without a GPU it says so, runs the parts that need none (the
# simulated check) and exits 2.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/gpu-run}
WORK=$(mktemp -d /tmp/stepscope-gpu-run.XXXXXX)
LOGS=$WORK/logs
mkdir -p "$OUT" "$LOGS"
cd "$REPO" || exit 1
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
started=$SECONDS

if [ -d .whl ] && ! $PY -c 'import msgspec, isal' 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}

# The native fast tier and the simulation's C reads, built here where a compiler is (else the
# copies carried along, else the sampler runs in Python and the native lines say so).
if command -v cc >/dev/null; then
    cc -O2 -Wall -shared -fPIC -o stepscope/sidecar/nvml/_fast_sampler.so stepscope/sidecar/nvml/fast_sampler.c -lpthread
    cc -O2 -Wall -shared -fPIC -I stepscope/sidecar/nvml -o stepscope/testing/nvml/_simulated_nvml.so \
        stepscope/testing/nvml/simulated_nvml.c
fi

# All steps end within BUDGET seconds, so that the summary is written inside the caller's limit.
BUDGET=${BUDGET:-360}
step() {  # step NAME SECONDS COMMAND...: runs it with a time limit, its output in $LOGS/NAME.log
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS left=$((BUDGET - (SECONDS - started)))
    if [ $left -lt 15 ]; then
        printf '%-22s skipped: the budget of %ss is spent\n' "$name" "$BUDGET" | tee -a "$LOGS/steps.txt"
        return
    fi
    [ "$limit" -le $left ] || limit=$left
    timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    printf '%-22s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$LOGS/steps.txt"
}

gpu=yes
if ! $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    gpu=no
fi
{
    echo "date: $(date -u +%FT%TZ)"
    echo "python: $($PY -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1)"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current,clocks.max.sm,clocks.sm,power.limit --format=csv
    $PY -c 'import pynvml as n; n.nvmlInit(); print("NVML driver", n.nvmlSystemGetDriverVersion(), "NVML", n.nvmlSystemGetNVMLVersion())' 2>&1
} >"$LOGS/machine.log" 2>&1

if [ $gpu = no ]; then
    echo "gpu_run: torch sees no CUDA device here: only the simulated check runs (the GPU steps need one)" >&2
    step gpu_check_simulated 200 $PY benchmarks/gpu_check.py --simulate --interval-us 1000 --steps 3 --out "$WORK/simulated"
    step gpu_check_sim_slowed 200 $PY benchmarks/gpu_check.py --simulate --interval-us 1000 --steps 3 \
        --slow-rank 1 --slow-ms 20 --out "$WORK/simulated-slowed"
else
    # The captures first: two ranks on the GPU, healthy at 100 us and 1 ms per tier, then one rank slowed.
    step gpu_check_python 90 $PY benchmarks/gpu_check.py --interval-us 100 --interval-us 1000 --out "$WORK/python"
    step gpu_check_native 90 $PY benchmarks/gpu_check.py --native --interval-us 100 --interval-us 1000 --out "$WORK/native"
    step gpu_check_slowed 75 $PY benchmarks/gpu_check.py --interval-us 1000 --slow-rank 1 --slow-ms 10 --out "$WORK/slowed"
    step analyze_healthy 30 $PY -m stepscope.cli analyze "$WORK/python/session-1000us"
    step analyze_slowed 30 $PY -m stepscope.cli analyze "$WORK/slowed/session-1000us"
    step nvml_sampler 35 env STEPSCOPE_NATIVE_SAMPLER=1 $PY benchmarks/nvml_sampler.py --backend nvml --seconds 2
    step pynvml_calls 20 $PY benchmarks/pynvml_calls.py --real --repeat 3
    # tests/sidecar/test_session_flow.py's GPU test needs boto3 (its module's S3 fixtures) and
    # recorded traces, which a bare GPU machine lacks.
    step gpu_tests 75 $PY -m pytest -m gpu -p no:cacheprovider -q -rA -s tests/agent/test_gpu.py tests/sidecar/nvml
    step gpu_gemm 30 $PY benchmarks/gpu_gemm.py --out "$WORK/gemm"
    step agent_overhead_cuda 60 $PY benchmarks/agent_overhead.py --device cuda --steps 1000 --rounds 15 --repeats 1 \
        --starts 3
fi

# What docs/benchmarks.md records, in one table; the logs hold the rest.
$PY - "$WORK" "$LOGS" >"$OUT/summary.txt" 2>&1 <<'EOF'
import json, sys
from pathlib import Path

work, logs = Path(sys.argv[1]), Path(sys.argv[2])
print((logs / "machine.log").read_text())
print((logs / "steps.txt").read_text() if (logs / "steps.txt").exists() else "no steps ran")
for run in ("python", "native", "slowed", "simulated", "simulated-slowed"):
    path = work / run / "gpu-check.json"
    if not path.exists():
        continue
    check = json.loads(path.read_text())
    print(f"== gpu_check {run}: {check['device']}, {check['ranks']} ranks, native={check['native']}")
    for c in check["captures"]:
        rates = "; ".join(f"GPU {g}: {r['achievedHz']:.0f}/{r['askedHz']:.0f} Hz ({100 * r['ratio']:.1f} %)" for g, r in c["rates"].items())
        print(f"-- {c['intervalUs']} us: {rates}")
        print("   sampler:", " | ".join(c["sampler"])[:900])
        print("   with values:", ", ".join(c["metricsWithValues"]))
        print("   without values:", ", ".join(c["metricsWithoutValues"]))
        for name, t in c["counterTracks"].items():
            print(f"   track {name}: {t['count']} events, {t['min']:g} .. {t['max']:g}")
        for line in c["diagnosis"]:
            print("   diagnosis:", line[:600])
        for k in c["kernelEfficiency"]:
            print("   efficiency:", json.dumps(k)[:300])
for name, keep in (("nvml_sampler", None), ("pynvml_calls", None), ("gpu_gemm", None), ("agent_overhead_cuda", None),
                   ("analyze_slowed", 40), ("gpu_tests", 60)):
    path = logs / f"{name}.log"
    if path.exists():
        lines = [l for l in path.read_text().splitlines() if "USDT" not in l and "profiler_st" not in l]
        print(f"== {name}")
        print("\n".join(lines[-keep:] if keep else lines[-40:]))
EOF
for run in python native slowed simulated simulated-slowed; do
    [ -d "$WORK/$run" ] || continue
    cp "$WORK/$run/gpu-check.json" "$LOGS/gpu-check-$run.json" 2>/dev/null
    for s in "$WORK/$run"/session-*; do
        [ -d "$s/report" ] || continue
        for f in diagnosis.json kernel_efficiency.csv; do
            cp "$s/report/$f" "$LOGS/$run-$(basename "$s")-$f" 2>/dev/null
        done
    done
    cp "$WORK/$run"/logs/*.log "$LOGS/" 2>/dev/null && for f in "$WORK/$run"/logs/*.log; do
        mv "$LOGS/$(basename "$f")" "$LOGS/$run-$(basename "$f")"
    done
done
tar -czf "$OUT/results.tar.gz" -C "$WORK" logs
cat "$OUT/summary.txt"
echo "gpu_run: $((SECONDS - started)) s; summary in $OUT/summary.txt, logs in $OUT/results.tar.gz"
[ $gpu = yes ] || exit 2
