#!/usr/bin/python3
"""bench_kd's distillation step against the same step written as a PyTorch loop, side by side.

  F  `bench_kd --reps 1 --layouts C`: flowtrain's graph, layout C (2 graph threads; the teacher
     at concurrency 2 on 1 intra-op thread, the student on 1), 20 steps of 64 a run;
  P<w>t<t> the PyTorch loop a user would write for the same step: torchvision's ImageFolder over
     the same folder and a DataLoader with num_workers w (PIL decode, RandomResizedCrop to 112
     px with scale 0.5-1, horizontal flip, ImageNet normalisation, batches of 64), the teacher
     under no_grad, the student's forward, backward and AdamW step, torch on t intra-op threads
     (--threads; 1 is what Debian's torch takes by default on these machines).

The models are bench_kd's: torchvision VisionTransformer with 16 px patches, MLP 4x dim, no
dropout; teacher dim 384 depth 6 heads 6 (random weights, frozen), student dim 192 depth 4 heads
3, 10 classes. The loss is flowtrain's kd_loss: alpha CE + (1 - alpha) T^2 KL(teacher_T ||
student_T), alpha 0.5, T 2; AdamW lr 1e-3, weight decay 0.05, gradient norm clipped at 1.
With --autocast bf16 both models compute under torch.autocast("cpu", bfloat16), as flowtrain's
do. A P run times --steps steps from the DataLoader's creation (its workers' start-up included,
as a bench_kd run includes its graph's start) to the last optimizer step, after a warm-up run of
3 steps per arm. The arms alternate within each of --reps rounds; it prints the medians of
images/s and the median of the per-round ratios F / P at P's best arm.

  /usr/bin/python3 bench/kd_peer.py --reps 5 --autocast bf16 --data data/synthetic-kd/train
"""
import argparse
import contextlib
import datetime
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

ROOT = Path(__file__).resolve().parent.parent
SIZE, BATCH, CLASSES = 112, 64, 10
ALPHA, TEMPERATURE = 0.5, 2.0
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def vit(dim, depth, heads):
    return torchvision.models.VisionTransformer(
        image_size=SIZE, patch_size=16, num_layers=depth, num_heads=heads, hidden_dim=dim,
        mlp_dim=4 * dim, dropout=0.0, attention_dropout=0.0, num_classes=CLASSES)


def kd_loss(student, teacher, labels):
    """flowtrain's kd_loss (soft, no regression head) with alpha 0.5, temperature 2."""
    kd = F.kl_div(F.log_softmax(student / TEMPERATURE, 1),
                  F.log_softmax(teacher.detach() / TEMPERATURE, 1),
                  reduction="batchmean", log_target=True)
    return ALPHA * F.cross_entropy(student, labels) + (1 - ALPHA) * TEMPERATURE**2 * kd


class Peer:
    def __init__(self, data, autocast):
        torch.manual_seed(1)
        # In eval mode nn.MultiheadAttention takes its fused inference path, which LibTorch 1.13
        # refuses under CPU autocast (bf16 activations, float32 weights); in train mode, with no
        # dropout, the teacher computes the same outputs through the unfused path.
        self.teacher = vit(384, 6, 6).train(autocast == "bf16").requires_grad_(False)
        self.student = vit(192, 4, 3).train()
        self.optimizer = torch.optim.AdamW(self.student.parameters(), lr=1e-3,
                                           weight_decay=0.05)
        self.autocast = autocast
        self.dataset = datasets.ImageFolder(str(data), transforms.Compose([
            transforms.RandomResizedCrop(SIZE, scale=(0.5, 1.0)),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]))

    def precision(self):
        if self.autocast == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def run(self, workers, steps):
        """images/s of `steps` distillation steps, the DataLoader's start-up included."""
        start, done = time.perf_counter(), 0
        loader = DataLoader(self.dataset, batch_size=BATCH, shuffle=True, drop_last=True,
                            num_workers=workers)
        while done < steps:
            for x, y in loader:
                with torch.no_grad(), self.precision():
                    teacher = self.teacher(x)
                with self.precision():
                    loss = kd_loss(self.student(x).float(), teacher.float(), y)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.student.parameters(), 1.0)
                self.optimizer.step()
                done += 1
                if done == steps:
                    break
        del loader  # its workers end here, inside the timed span
        return steps * BATCH / (time.perf_counter() - start)


def run_flowtrain(args):
    """Layout C's images/s from one `bench_kd --reps 1` (its own warm-up, then one run)."""
    command = [str(args.bench_kd), "--reps", "1", "--layouts", "C", "--steps", str(args.steps),
               "--autocast", args.autocast, "--data", str(args.data)]
    run = subprocess.run(command, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if run.returncode != 0:
        sys.exit(f"kd_peer: bench_kd failed:\n{run.stdout}")
    return float(re.search(r"^\| 1 \| ([\d.]+) \|", run.stdout, re.M).group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2],
                   help="DataLoader num_workers to try")
    p.add_argument("--threads", type=int, nargs="+", default=[1],
                   help="P: torch intra-op threads to try (each with every --workers)")
    p.add_argument("--autocast", choices=["none", "bf16"], default="bf16")
    p.add_argument("--data", type=Path, default=ROOT / "data/synthetic-kd/train")
    p.add_argument("--bench-kd", type=Path, default=ROOT / "build/bench/bench_kd")
    args = p.parse_args()
    if not args.data.is_dir():
        sys.exit(f"kd_peer: no {args.data}: make kd-demo generates it")
    model_name = re.search(r"Model name:\s*(.*)", subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout).group(1)
    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"machine: {os.cpu_count()} cores, {model_name}; torch {torch.__version__} "
          f"(default threads {torch.get_num_threads()}), torchvision {torchvision.__version__}; "
          f"load average {os.getloadavg()[0]:.2f}")

    peer = Peer(args.data, args.autocast)
    arms = {f"P{w}t{t}": (w, t) for t in args.threads for w in args.workers}
    for w, t in arms.values():
        torch.set_num_threads(t)
        peer.run(w, 3)
    rates = {"F": [], **{arm: [] for arm in arms}}
    for r in range(args.reps):
        if args.bench_kd.is_file():
            rates["F"].append(run_flowtrain(args))
        for arm, (w, t) in arms.items():
            torch.set_num_threads(t)
            rates[arm].append(peer.run(w, args.steps))
        print(f"round {r + 1}: " + ", ".join(f"{a} {v[-1]:.1f}" for a, v in rates.items() if v),
              file=sys.stderr, flush=True)
    median = {arm: statistics.median(v) if v else None for arm, v in rates.items()}
    best = max(arms, key=lambda arm: median[arm])
    ratio = (statistics.median(f / q for f, q in zip(rates["F"], rates[best]))
             if rates["F"] else None)

    def fmt(x, digits=1):
        return "-" if x is None else f"{x:.{digits}f}"

    print(f"\nimages/s, medians of {args.reps} rounds of {args.steps} steps of {BATCH}, "
          f"autocast {args.autocast}; P<w>t<t>: the PyTorch loop, DataLoader num_workers=w, "
          f"torch on t threads\n")
    print("| F bench_kd layout C | " + " | ".join(arms) + " | F / P (best) |")
    print("|---:" * (2 + len(arms)) + "|")
    print(f"| {fmt(median['F'])} | " + " | ".join(fmt(median[arm]) for arm in arms)
          + f" | {fmt(ratio, 2)} ({best}) |")
    print("\nper round: " + "; ".join(
        f"{arm} " + ", ".join(f"{x:.1f}" for x in v) for arm, v in rates.items()))


if __name__ == "__main__":
    main()
