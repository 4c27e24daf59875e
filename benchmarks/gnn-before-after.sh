#!/usr/bin/env bash
# `terastack bench gnn` and `terastack bench gnn --hetero` with two trees side by side on one machine (e.g. main
# before a change and the branch after it), to tell whether the change is within the run-to-run spread:
#
#   git worktree add /tmp/gnn-before 4f65f44        # the tree before, with the native I/O core copied in:
#   cp terastack/io/_tsio*.so /tmp/gnn-before/terastack/io/
#   bash benchmarks/gnn-before-after.sh /tmp/gnn-before "$PWD" [ROUNDS=2] [OUT=benchmarks/gnn-before-after-runs]
#
# Every round runs the trees in turn (before, then after; the homogeneous benchmark, then the heterogeneous one),
# so that drift on the machine falls on both alike. Each run is one JSON in OUT (the benchmark's own --save); the
# generated datasets are made once and shared by both trees (the homogeneous one under $TERASTACK_CACHE, the
# heterogeneous one in OUT/hetero-data, --keep), so only the first run pays for generation. At the end a table
# gives each run's headline figures; compare the trees' spread. Nothing else should run on the machine meanwhile
# (about 45 minutes a round on a 2-core VM; the heterogeneous contenders run under an 8 GiB RSS watchdog).
# GNN_ARGS and HETERO_ARGS add flags to each benchmark; a smoke run of this script (a minute, figures meaningless):
#   GNN_ARGS="--nodes 20000 --feat-dim 64 --train-nodes 1024 --test-nodes 512 --batch-size 256 --fanouts 5,5
#   --hidden 32 --epochs 1 --tpc-rounds 1" HETERO_ARGS="--papers 2000 --feat-dim 16 --train-nodes 512
#   --test-nodes 128 --batch-size 128 --hidden 8 --fanouts 4,2 --presample-nodes 128 --holdout-nodes 128
#   --mmap-warmup-batches 1 --mmap-batches 2" TERASTACK_CACHE=/tmp/c bash benchmarks/gnn-before-after.sh A B 1 /tmp/o
set -eu
BEFORE=$(cd "$1" && pwd); AFTER=$(cd "$2" && pwd); ROUNDS=${3:-2}; OUT=${4:-benchmarks/gnn-before-after-runs}
PY=${PYTHON:-python}
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
    for tree in before after; do
        src=$([ "$tree" = before ] && echo "$BEFORE" || echo "$AFTER")
        echo "round $round, $tree ($src)" >&2
        PYTHONPATH="$src" "$PY" -m terastack bench gnn --quiet ${GNN_ARGS:-} \
            --save "$OUT/gnn_${tree}_${round}.json" >/dev/null
        PYTHONPATH="$src" "$PY" -m terastack bench gnn --hetero --keep --dir "$OUT/hetero-data" --quiet ${HETERO_ARGS:-} \
            --save "$OUT/gnn-hetero_${tree}_${round}.json" >/dev/null
    done
done
"$PY" - "$OUT" <<'EOF'
import glob, json, os, statistics, sys

out = sys.argv[1]
keys = {"gnn": ["terastack_epoch_seconds", "in_memory_pipelined_epoch_seconds", "slowdown_vs_in_memory_pipelined",
                "speedup_vs_sync_gather", "speedup_vs_mmap", "loss_curves_identical"],
        "gnn-hetero": ["terastack_epoch_seconds", "in_memory_pipelined_epoch_seconds",
                       "slowdown_vs_in_memory_pipelined", "speedup_vs_mmap", "loader_speedup_vs_mmap", "tpc_error",
                       "loss_curves_identical"]}
for bench, names in keys.items():
    print(f"\n{bench}")
    for tree in ("before", "after"):
        rows = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, f"{bench}_{tree}_*.json")))]
        for r in rows:
            print(f"  {tree:6s} " + "  ".join(f"{k}={r.get(k)}" for k in names))
        epochs = [s for r in rows for s in r["terastack_epoch_seconds"]]
        if epochs:
            print(f"  {tree:6s} terastack epoch seconds: mean {statistics.mean(epochs):.2f}, "
                  f"min {min(epochs):.2f}, max {max(epochs):.2f} over {len(epochs)} epochs")
EOF
