#!/usr/bin/env bash
# One LoRA step (rank 16, 64 tokens) on a Llama-3-70B-shaped base resting and streaming as NF4, under the RSS
# watchdog of `terastack bench llm-scale` ([Note: the RSS watchdog] in terastack/llm/bench/bench_scale.py): the
# child is killed when its process tree passes --rss-limit, and every file it made is deleted after the row.
#
#   benchmarks/llm-70b-nf4-lora.sh [DIR]      (DIR: a directory on the SSD; default /tmp/terastack-70b)
#
# Before anything is written, the bench's disk pre-flight sizes the row from the base as it rests: the base's
# model directory (written in fp32, 4 bytes per parameter) plus the store's NF4 base (linear weights at 0.5625
# bytes per parameter, embedding and head native). At 70.6B parameters that is about 338 GiB with the margin; with the base
# directory written as it is today (bench_worker.write_base: a whole random-init model in memory, saved with
# save_pretrained) the row is refused up front on this machine (about 65 GB free, 23 GiB RAM). The step itself
# plans within 4 GiB (terastack plan llm --model llama-3-70b --lora 16 --base-format nf4 --dtype bfloat16
# --seq-len 64 --host-budget 1GiB --device-budget 2.5GiB: fits, 38.9 GiB of NF4 base on the SSD, predicted
# about 1860 s a step on this machine, compute-bound).
set -euo pipefail
DIR=${1:-/tmp/terastack-70b}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$HERE/.venv/bin/python}
[ -x "$PY" ] || PY=python
OUT=$HERE/benchmarks/llm-70b-nf4-lora_$(hostname -s)_$(date -u +%F).json
mkdir -p "$DIR"
cleanup() { rm -rf "$DIR"; }  # the bench deletes its rung's files; this removes what is left (probe, logs)
trap cleanup EXIT
cd "$HERE"
PYTHONPATH=$HERE "$PY" -m terastack.cli bench llm-scale --json \
    --sizes llama-3-70b --systems terastack --lora 16 --base-format nf4 \
    --seq-len 64 --batch-size 1 --steps 1 --warmup 0 \
    --budget 4GiB --rss-limit 4GiB --timeout 10800 --dir "$DIR" > "$OUT"
echo "result: $OUT" >&2
