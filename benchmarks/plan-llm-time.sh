#!/usr/bin/env bash
# How long `terastack plan llm` takes for named models: the first question (the model profiled: torch and
# transformers' model code imported) and the same question again (the kept profile read: [Note: kept profiles] in
# terastack/llm/plan_cmd.py). Run on a quiet machine; the answers are checked equal.
#   bash benchmarks/plan-llm-time.sh            (a fresh cache of its own, removed at the end)
set -euo pipefail
export TERASTACK_CACHE=$(mktemp -d)
trap 'rm -rf "$TERASTACK_CACHE"' EXIT
for model in llama-2-7b llama-3-70b opt-175b; do
  for run in first again again; do
    start=$(date +%s.%N)
    out=$( { /usr/bin/time -f "%U %S" terastack plan llm --model "$model" --hardware rtx4090-workstation --json \
             > "$TERASTACK_CACHE/$model-$run.json"; } 2>&1 )
    end=$(date +%s.%N)
    printf '%-12s %-6s wall %6.2f s  cpu %s s\n' "$model" "$run" "$(echo "$end - $start" | bc)" \
      "$(echo "$out" | tail -1 | awk '{print $1 + $2}')"
  done
  cmp -s "$TERASTACK_CACHE/$model-first.json" "$TERASTACK_CACHE/$model-again.json" \
    && echo "$model: the same answer" || { echo "$model: ANSWERS DIFFER"; exit 1; }
done
