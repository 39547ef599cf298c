# Sourced by scripts/test-elastic, test-slurm and test-two-hosts: the training job they run
# under each launcher, and their timing helpers.

# launcher_job FLOWTRAIN DIR EPOCHS: 320 generated 40x40 images in DIR/train and the job
# DIR/job.yaml over them for EPOCHS epochs: the model and data of
# Dist.Launchers.SrunTorchrunAndNprocPlanTheSameCoresAndWeights (a ViT 48/2/3 at 32 px, 16
# images a step per rank: 10 steps an epoch on 2 ranks). `cores` is the caller's: `cores=2` for
# 2 ranks on one machine gives each 1 core under any launcher, so they do the same sums.
launcher_job() {
  local flowtrain=$1 dir=$2 epochs=$3
  "$flowtrain" gen-images --out "$dir/train" --count 320 --size 40x40 --classes 4 --seed 1 \
    > "$dir/gen-images.log" 2>&1 || { cat "$dir/gen-images.log" >&2; return 1; }
  cat > "$dir/job.yaml" <<YAML
stages:
  - {type: image_folder, name: source, params: {root: $dir/train, epochs: $epochs, seed: 3, shuffle: true}}
  - {type: jpeg_decode, concurrency: 2}
  - {type: augment, concurrency: 2, params: {size: 32, mode: train, scale: [0.6, 1.0]}}
  - {type: collate, params: {batch_size: 16, pool_size: 8}}
  - {type: student_step, queue_capacity: 2, params: {classes: 4, image_size: 32, patch_size: 8, dim: 48, depth: 2, heads: 3, alpha: 1, lr: 0.002, warmup_steps: 2, intraop_threads: auto}}
YAML
}

now() { date +%s.%N; }
# Seconds from time A to time B (both from now()), to the hundredth.
seconds() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# The median of the numbers given (of an even count, the lower middle one).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# free_ports N: N TCP ports of this machine that were free a moment ago.
free_ports() {
  /usr/bin/python3 -c '
import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))' "$1"
}
