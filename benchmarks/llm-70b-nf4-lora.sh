#!/usr/bin/env bash
# One LoRA step (rank 16, 64 tokens) on a Llama-3-70B-shaped base resting and streaming as NF4, under the RSS
# watchdog of `terastack bench llm-scale` ([Note: the RSS watchdog] in terastack/llm/bench/bench_scale.py): the
# child is killed when its process tree passes --rss-limit, and every file it made is deleted after the row.
#
#   benchmarks/llm-70b-nf4-lora.sh [DIR]      (DIR: a directory on the SSD; default /tmp/terastack-70b)
#
# The frozen base is a random initialization written straight into the store (Trainer.from_config with LoRA: each
# projection made in fp32 one at a time and quantized to NF4 as it reaches the store, [Note: a random
# initialization in bounded memory] in terastack/llm/model.py), so nothing but the store's NF4 base (linear weights
# at 0.5625 bytes per parameter, embedding and head in bf16) is on the disk: about 40 GiB at 70.6B parameters.
# The step computes in bf16 (terastack plan llm --model llama-3-70b --lora 16 --base-format nf4 --dtype bfloat16
# --seq-len 64 --host-budget 1GiB --device-budget 2.5GiB: fits, predicted about 219 s a step on this machine).
# The engine's budget is 3.5 GiB of the 4 GiB the watchdog allows: at 1.1B with an NF4 base in bf16 the process
# passed its memory budget by about 0.1 GB while the store filled and 0.04 GB in a step (2026-12-05).
# Measured on 2026-12-05: benchmarks/llm-70b-nf4-lora_2core-epyc_2026-12-05.md (175 s a step, peak RSS 3.69 GiB);
# on 2026-12-06 (Xeon VM, set-up held to the budget): benchmarks/llm-70b-nf4-lora_2core-xeon_2026-12-06.md (560 s, 3.92 GiB).
set -euo pipefail
DIR=${1:-/tmp/terastack-70b}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
[ -x "$PY" ] || PY=python
OUT=$HERE/benchmarks/llm-70b-nf4-lora_${MACHINE:-$(hostname -s)}_$(date -u +%F).json  # MACHINE: a name for this machine
mkdir -p "$DIR"
cleanup() { rm -rf "$DIR"; }  # the bench deletes its rung's files; this removes what is left (probe, logs)
trap cleanup EXIT
cd "$HERE"
PYTHONPATH=$HERE "$PY" -m terastack.cli bench llm-scale --json \
    --sizes llama-3-70b --systems terastack --lora 16 --base-format nf4 --dtype bfloat16 \
    --seq-len 64 --batch-size 1 --steps 1 --warmup 0 \
    --budget 3.5GiB --rss-limit 4GiB --timeout 10800 --dir "$DIR" > "$OUT"
echo "result: $OUT" >&2
