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
# free_ports N: N TCP ports into PORTS (an array) that a listener can bind and no neighbour
# takes: below the kernel's ephemeral range (which connect() and port 0 draw from), each held
# until this shell exits by a lock in /tmp/flowtrain-ports, the locks flowtrain's own
# free_local_port takes (distributed/launch.cpp). Call it in this shell, not in $(...): the
# locks live in the shell that took them.
free_ports() {
  local low fd port
  low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  [ "$low" -gt 21000 ] || low=21000
  mkdir -p /tmp/flowtrain-ports && chmod 1777 /tmp/flowtrain-ports 2>/dev/null || true
  PORTS=()
  while [ ${#PORTS[@]} -lt "$1" ]; do
    port=$((20000 + (RANDOM * 32768 + RANDOM) % (low - 20000)))
    [ "$port" -lt 29400 ] || [ "$port" -ge 29600 ] || continue  # torchrun's defaults and kin
    exec {fd}<>"/tmp/flowtrain-ports/$port" || continue
    if flock -n "$fd" && /usr/bin/python3 -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; then
      PORTS+=("$port")
    else
      exec {fd}>&-
    fi
  done
}
