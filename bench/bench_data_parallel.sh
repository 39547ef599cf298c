#!/usr/bin/env bash
# Data-parallel step time: 1 rank on 1 core vs 2 ranks on 1 core each (`flowtrain run --nproc 2`),
# the vit_cpu_student at 112 px, 32 images per rank and step, supervised. Prints the per-step
# split (forward, backward, sync wait, optimizer), the all-reduce time and the share of it
# hidden behind backward, as medians over alternating repetitions.
#
#   bench/bench_data_parallel.sh [build dir] [reps] [steps]
set -euo pipefail
build=${1:-build}
reps=${2:-3}
steps=${3:-12}
cli=$build/apps/flowtrain/flowtrain
work=$(mktemp -d /tmp/flowtrain-bench-dp-XXXXXX)
trap 'rm -rf "$work"' EXIT

$cli gen-images --out "$work/images" --count $((steps * 64)) --size 128x128 --classes 10 >/dev/null
cat > "$work/dp.yaml" <<YAML
threads: 1
cores: 1
stages:
  - {type: image_folder, name: source, params: {root: $work/images, seed: 1}}
  - {type: jpeg_decode, params: {min_side: 112}}
  - {type: augment, params: {size: 112}}
  - {type: collate, params: {batch_size: 32, drop_last: true}}
  - type: train_step
    queue_capacity: 2
    params: {model: vit_cpu_student, image_size: 112, classes: 10, alpha: 1, intraop_threads: 1}
YAML

# One line per run: wall, images/s and the per-step numbers of rank 0's train_step.
run() {
  local ranks=$1 log="$work/run.log"
  if [ "$ranks" = 1 ]; then
    # One rank sees half the data, so both layouts take the same number of steps.
    $cli run "$work/dp.yaml" stages.source.params.limit=$((steps * 32)) > "$log" 2>&1
  else
    $cli run "$work/dp.yaml" --nproc 2 > "$log" 2>&1
  fi
  local line wall
  line=$(grep -m1 "results of 'train_step'" "$log")
  wall=$(grep -m1 "^wall" "$log" | awk '{print $2}')
  get() { local v; v=$(echo "$line" | grep -o "$1 [0-9.e+-]*" | awk '{print $2}'); echo "${v:-0}"; }
  echo "$ranks $wall $(get steps) $(get forward_ms) $(get backward_ms) $(get sync_wait_ms) $(get sync_comm_ms) $(get optimizer_ms)"
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

run 1 >/dev/null  # warm-up: first touch of memory and files
results=()
for ((r = 0; r < reps; ++r)); do
  results+=("$(run 1)" "$(run 2)")
done

echo "bench_data_parallel: $(date -u +%F), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
echo "command: bench/bench_data_parallel.sh $build $reps $steps   ($steps steps of 32 images per rank)"
printf "%-6s %9s %8s %11s %12s %13s %13s %13s %8s\n" ranks "images/s" "step ms" "forward ms" "backward ms" "sync wait ms" "all-reduce ms" "optimizer ms" hidden
for ranks in 1 2; do
  col() { printf '%s\n' "${results[@]}" | awk -v r="$ranks" -v c="$1" '$1 == r {print $c}' | median; }
  wall=$(col 2); n=$(col 3); fwd=$(col 4); bwd=$(col 5); wait=$(col 6); comm=$(col 7); opt=$(col 8)
  awk -v r="$ranks" -v wall="$wall" -v n="$n" -v f="$fwd" -v b="$bwd" -v w="${wait:-0}" -v c="${comm:-0}" -v o="$opt" 'BEGIN {
    hidden = (c > 0) ? sprintf("%.0f%%", 100 * (c - w) / c) : "-";
    printf "%-6d %9.1f %8.1f %11.1f %12.1f %13.1f %13.1f %13.1f %8s\n", r, n * 32 * r / wall, 1000 * wall / n, f, b, w, c, o, hidden }'
done
