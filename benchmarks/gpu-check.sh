#!/usr/bin/env bash
# terastack on one NVIDIA GPU: every CUDA path run once, each step under its own timeout, in under 8 minutes
# on one large GPU. Steps and what each checks: docs/gpu.md.
#
#   pip install --no-deps -e .      # PyTorch with CUDA, transformers, peft, torch_geometric already there
#   bash benchmarks/gpu-check.sh [OUT.json]
#
# Writes one JSON (default benchmarks/gpu-check_<host>_<date>.json) and prints the figures. Without a GPU it
# stops at once with one line saying so (exit 0: nothing to check here).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1 \
   || ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu-check: no CUDA GPU on this machine (nvidia-smi or torch.cuda.is_available() says none); nothing run"
    exit 0
fi

# the device ledger counts bytes, the caching allocator rounds and fragments: expandable segments keep the two
# close (set PYTORCH_CUDA_ALLOC_CONF yourself to run without)
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
OUT=${1:-benchmarks/gpu-check_$(hostname -s)_$(date -u +%Y-%m-%d).json}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/terastack-gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STEPS=()
started=$(date +%s)

# step NAME SECONDS CMD...: run CMD under `timeout SECONDS`, its output in $WORK/NAME.log, its status recorded
step() {
    local name=$1 limit=$2; shift 2
    local t0=$(date +%s%N)
    echo "gpu-check: $name (at most ${limit}s) ..."
    timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    local secs=$(( ms / 1000 )).$(printf %03d $(( ms % 1000 )))
    local status=ok
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && status=timeout
    [ $rc -ne 0 ] && [ "$status" = ok ] && status=failed
    echo "gpu-check: $name $status (exit $rc, ${secs}s)"
    [ "$status" = ok ] || tail -n 15 "$WORK/$name.log" | sed 's/^/    /'
    STEPS+=("$name $status $rc $secs")
}

RACES="tests/tiers/test_store_gpu.py tests/gnn/test_gnn_cache_gpu.py tests/llm/test_gradient_copies.py"
# 1. every test marked gpu except the race repros (step 2)
step pytest_gpu 75 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests \
    --ignore=tests/tiers/test_store_gpu.py --ignore=tests/gnn/test_gnn_cache_gpu.py \
    --ignore=tests/llm/test_gradient_copies.py --ignore=tests/disdp/test_nccl.py
# 2. the race repros, three times over (a race need not show on every run)
step races 45 bash -c "for i in 1 2 3; do $PY -m pytest -q -p no:cacheprovider $RACES || exit 1; done"
# 3. mid-size Llama (vocab 128k, hidden 1024, 8 layers) in bf16: calibration, automatic device budget, 2 GiB host
step llm_bf16 60 "$PY" benchmarks/gpu_check.py llm --dtype bfloat16 --dir "$WORK" --out "$WORK/llm_bf16.json"
# 4. the same in fp32, against plain PyTorch AdamW on the CPU
step llm_fp32 80 "$PY" benchmarks/gpu_check.py llm --dtype float32 --reference --dir "$WORK" \
    --out "$WORK/llm_fp32.json"
# 5. a 1.1B Llama in bf16, device budget a quarter of its weights, against in-memory training on the GPU
step bench_llm 110 "$PY" benchmarks/gpu_check.py bench-llm --model llama-1.1b --dir "$WORK" \
    --out "$WORK/bench_llm.json"
# 6. the storage engine against fio
step bench_io 35 "$PY" -m terastack.cli bench io --quick --dir "$WORK" --save "$WORK/bench_io.json"
# 7. GNN training with a device cache (a quarter of the cache budget in GPU memory)
step bench_gnn 45 "$PY" -m terastack.cli bench gnn --nodes 400000 --train-nodes 16384 --epochs 1 \
    --baseline-epochs 1 --tpc-rounds 1 --tpc-fractions 1 --device-share 0.25 --quiet --dir "$WORK/gnn" \
    --save "$WORK/bench_gnn.json"
# 8. the out-of-core GEMM with its tiles in GPU memory, and its result check
step bench_gemm 35 "$PY" -m terastack.cli bench gemm --quick --dir "$WORK" --save "$WORK/bench_gemm.json"
# 9. terastack dist on NCCL: 2-rank jobs (one GPU per rank), against AdamW and the same job on gloo; one GPU
#    cannot hold two NCCL ranks, so on one GPU (this script's machine) the step is skipped at once
if [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null)" -ge 2 ] 2>/dev/null; then
    step dist_nccl 60 "$PY" -m pytest -q -p no:cacheprovider tests/disdp/test_nccl.py -k "2-ranks or two_rank"
else
    echo "gpu-check: dist_nccl skipped (one GPU: NCCL needs a GPU per rank; run it where two GPUs are)"
fi

"$PY" - "$OUT" "$WORK" "$started" "${STEPS[@]}" <<'EOF'
import json, os, platform, sys, time
import torch

out, work, started, steps = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
result = {"machine": {"host": platform.node(), "gpu": torch.cuda.get_device_name(0),
                      "gpus": torch.cuda.device_count(), "torch": torch.__version__, "cuda": torch.version.cuda},
          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "total_s": time.time() - started,
          "steps": {}}
for line in steps:
    name, status, rc, secs = line.split()
    entry = {"status": status, "exit": int(rc), "seconds": float(secs)}
    path = os.path.join(work, name + ".json")
    if os.path.exists(path):
        try:
            entry["result"] = json.load(open(path))
        except ValueError as exc:
            entry["result_error"] = str(exc)
    log = os.path.join(work, name + ".log")
    if status != "ok" and os.path.exists(log):
        entry["log_tail"] = open(log, errors="replace").read()[-3000:]
    result["steps"][name] = entry
with open(out, "w") as f:
    json.dump(result, f, indent=1, default=str)

def fig(name, *keys):
    r = result["steps"].get(name, {}).get("result", {})
    for k in keys:
        r = r.get(k) if isinstance(r, dict) else None
    return r

print(f"\ngpu-check on {result['machine']['gpu']} in {result['total_s']:.0f}s -> {out}")
for name, e in result["steps"].items():
    print(f"  {name:12s} {e['status']:8s} {e['seconds']:6.1f}s")
for dt in ("bf16", "fp32"):
    steps_s = fig(f"llm_{dt}", "step_s")
    if steps_s:
        print(f"  mid Llama {dt}: steps {', '.join(f'{s:.2f}' for s in steps_s)} s; peak reserved "
              f"{fig(f'llm_{dt}', 'peak_reserved_bytes') / 2**30:.2f} GiB; stalls {fig(f'llm_{dt}', 'stalls')}")
if fig("llm_fp32", "max_weight_diff") is not None:
    print(f"  fp32 vs CPU reference: max weight diff {fig('llm_fp32', 'max_weight_diff'):.2e} "
          f"(matches: {fig('llm_fp32', 'matches_reference')})")
if fig("bench_llm", "median_step_s"):
    print(f"  1.1B bf16, quarter device budget: {fig('bench_llm', 'median_step_s')} "
          f"-> {fig('bench_llm', 'slowdown_vs_in_memory'):.2f}x in-memory GPU step")
EOF
for s in "${STEPS[@]}"; do case $s in *" ok "*) ;; *) exit 1;; esac; done
