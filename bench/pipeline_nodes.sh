#!/usr/bin/env bash
# Side by side: a training step's partitions as threads inside the `train_step` node (a build
# from before 2026-11-27) against the same partitions as nodes of the graph (this one),
# alternating runs.
#
#   bench/pipeline_nodes.sh BASE_BUILD NEW_BUILD [REPS] [DATA] [EPOCHS]
#
# A ViT dim 192, depth 12, heads 3, patch 8 at 64 px (kd.yaml's teacher made deeper), batch 64,
# float32, EPOCHS (2) epochs of data/DATA (synthetic-kd/train: 800 72x72 images, 25 steps;
# `make kd-data` makes them; synthetic-640x360: 512 larger ones, `make bench-data`) through
# image_folder -> jpeg_decode (2 workers) -> augment (2) -> collate, on 2 cores:
#   whole    the model unsplit on 2 intra-op threads, 1 graph thread (the new build)
#   threads  base: 2 partitions on threads inside train_step, intraop_threads 2 (1 each),
#            1 graph thread
#   nodes    new: 2 partition nodes, intraop_threads 1 (each), 2 graph threads
# Both pipelines run 1f1b with 8 micro-batches. Each layout runs REPS + 1 times in turn (the
# first a warm-up); printed: the median wall time, images/s (the images over it), the median
# pipeline_bubble, the final loss, and whether `threads` and `nodes` ended with the same
# checkpoint (weights, optimizer state and RNG, scripts/same-tensors).
#
# With BASE_LAYOUT=nodes (a base that has partition nodes too), the layouts are whole and nodes
# of each build instead, base-whole whole base-nodes nodes in turn, and each pair of the same
# layout must end with the same checkpoint: a change of the new build against the previous one.
set -euo pipefail
base=$1/apps/flowtrain/flowtrain
new=$2/apps/flowtrain/flowtrain
reps=${3:-3}
data=${4:-synthetic-kd/train}
epochs=${5:-2}
root=$(cd "$(dirname "$0")/.." && pwd)
images=$(( $(find "$root/data/$data" -name '*.jpg' | wc -l) * epochs ))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

cat > "$dir/deep.yaml" <<YAML
cores: 2
threads: 1
stages:
  - {type: image_folder, name: source, params: {root: $root/data/$data, epochs: $epochs, seed: 1}}
  - {type: jpeg_decode, concurrency: 2}
  - {type: augment, concurrency: 2, params: {size: 64, scale: [0.5, 1.0], seed: 1}}
  - {type: collate, params: {batch_size: 64, pool_size: 6}}
  - {type: train_step, name: student, queue_capacity: 2,
     params: {classes: 10, image_size: 64, patch_size: 8, dim: 192, depth: 12, heads: 3,
              alpha: 1, lr: 0.002, warmup_steps: 10, intraop_threads: 2, checkpoint_dir: CKPT}}
YAML
S=stages.student.params
pipe="$S.partitions=2 $S.microbatches=8 $S.partition_schedule=1f1b"
run() {  # run NAME BINARY ARGS...: prints "wall bubble loss"
  local name=$1 bin=$2; shift 2
  "$bin" run "$dir/deep.yaml" "$S.checkpoint_dir=$dir/$name" "$@" > "$dir/$name.log" 2>&1
  awk '/^wall/{w=$2} / pipeline_bubble /{for(i=1;i<=NF;i++) if($i=="pipeline_bubble") b=$(i+1)}
       / loss /{for(i=1;i<=NF;i++) if($i=="loss") l=$(i+1)}
       END{printf "%s %s %s", w, b == "" ? "-" : b, l}' \
    "$dir/$name.log"
}
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }

nodes="threads=2 $S.intraop_threads=1 $pipe"
if [ "${BASE_LAYOUT:-threads}" = nodes ]; then
  layouts="base-whole whole base-nodes nodes"; pairs="base-whole:whole base-nodes:nodes"
else
  layouts="whole threads nodes"; pairs="threads:nodes"
fi
declare -A walls bubbles loss
for r in $(seq 0 "$reps"); do
  for layout in $layouts; do
    case $layout in
      whole) out=$(run whole "$new") ;;
      base-whole) out=$(run base-whole "$base") ;;
      threads) out=$(run threads "$base" $pipe) ;;
      nodes) out=$(run nodes "$new" $nodes) ;;
      base-nodes) out=$(run base-nodes "$base" $nodes) ;;
    esac
    read -r w b l <<< "$out"
    echo "round $r $layout: wall $w s, pipeline_bubble $b, loss $l" >&2
    [ "$r" -eq 0 ] && continue
    walls[$layout]+="$w "; bubbles[$layout]+="$b "; loss[$layout]=$l
  done
done
echo "| layout | wall s ($reps runs) | median | images/s | vs whole | pipeline_bubble | loss |"
echo "|---|---|---:|---:|---:|---:|---:|"
w0=$(median ${walls[whole]})
for layout in $layouts; do
  w=$(median ${walls[$layout]})
  awk -v n="$layout" -v all="${walls[$layout]% }" -v w="$w" -v w0="$w0" -v images="$images" \
      -v b="$(median ${bubbles[$layout]})" -v l="${loss[$layout]}" \
      'BEGIN{printf "| %s | %s | %s | %.1f | %.2f | %s | %s |\n", n, all, w, images / w, w0 / w, b, l}'
done
for pair in $pairs; do
  a=${pair%:*} b=${pair#*:}
  same=$(python3 "$root/scripts/same-tensors" "$dir/$a/final.pt" "$dir/$b/final.pt" \
           > /dev/null && echo "identical" || echo "DIFFERENT")
  echo "$a (base) and $b (new) final checkpoints: $same"
done
