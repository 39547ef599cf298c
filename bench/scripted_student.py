#!/usr/bin/python3
"""A TorchScript student made in PyTorch against flowtrain's own model of the same architecture.

torchvision's resnet18, scripted (`torch.jit.script(model).save(path)`), and flowtrain's built-in
`resnet18` (the same layers: width 64, blocks 2-2-2-2, ImageNet stem) are each trained by
train_step on the same data, in the same graph:

  image_folder -> jpeg_decode (2) -> augment (112 px) -> collate (32) -> train_step
  (supervised, AdamW, clipping; 1 graph thread, --intraop intra-op threads)

The two arms alternate for --reps rounds after one warm-up run each, each run a fresh
`flowtrain.run` of --steps batches. Per arm it prints the median step time (train_step's
forward + backward + optimizer per step) as images/s, and the median of the per-round ratios
scripted / built-in (runs minutes apart drift on a shared machine; a ratio within a round
does not). The scripted model's report has no GFLOP/s (its shape is opaque to flowtrain).

  PYTHONPATH=build/python /usr/bin/python3 bench/scripted_student.py --reps 5
"""
import argparse
import datetime
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torchvision

import flowtrain

ROOT = Path(__file__).resolve().parent.parent
BATCH, SIZE, CLASSES = 32, 112, 10

CONFIG = """\
threads: 1
stages:
  - {{type: image_folder, params: {{root: {root}, seed: 1, epochs: {epochs}}}}}
  - {{type: jpeg_decode, concurrency: 2}}
  - {{type: augment, concurrency: 2, params: {{size: {size}, seed: 1}}}}
  - {{type: collate, params: {{batch_size: {batch}, pool_size: 4}}}}
  - type: train_step
    name: student
    params: {{model: {model}, classes: {classes}, image_size: {size}, alpha: 1, lr: 0.001,
             intraop_threads: {intraop}, autocast: {autocast}, seed: 1}}
"""


def result(report, stage, key):
    for phase in report["phases"]:
        for s in phase["stages"]:
            if s["name"] == stage:
                for r in s["results"]:
                    if r["name"] == key:
                        return r["value"]
    raise KeyError(f"{stage}.{key} not in the report")


def step_ms(config):
    # The run's own report goes to stdout (file descriptor 1, written by C++): kept out of the
    # table's way.
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1)
        try:
            report = flowtrain.run(config)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    return sum(result(report, "student", k) for k in ("forward_ms", "backward_ms", "optimizer_ms"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--intraop", type=int, default=2)
    parser.add_argument("--autocast", choices=["none", "bf16"], default="none")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        images = tmp / "images"
        cli = os.environ.get("FLOWTRAIN_CLI", str(ROOT / "build/apps/flowtrain/flowtrain"))
        subprocess.run([cli, "gen-images", "--out", str(images), "--count", str(BATCH * 4),
                        "--size", "128x128", "--classes", str(CLASSES), "--seed", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        torch.manual_seed(0)
        scripted = tmp / "resnet18.pt"
        torch.jit.script(torchvision.models.resnet18(num_classes=CLASSES)).save(str(scripted))
        configs = {}
        for arm, model in (("built-in resnet18", "resnet18"), ("scripted torchvision resnet18",
                                                                scripted)):
            path = tmp / f"{len(configs)}.yaml"
            path.write_text(CONFIG.format(root=images, epochs=(args.steps + 3) // 4, size=SIZE,
                                          batch=BATCH, model=model, classes=CLASSES,
                                          intraop=args.intraop, autocast=args.autocast))
            configs[arm] = str(path)
        for config in configs.values():
            step_ms(config)  # warm-up
        times = {arm: [] for arm in configs}
        for _ in range(args.reps):
            for arm, config in configs.items():
                times[arm].append(step_ms(config))
    builtin, script = (times[arm] for arm in configs)
    ratios = [b / s for b, s in zip(builtin, script)]
    print(f"Command: {' '.join(shlex.quote(a) for a in ['/usr/bin/python3'] + sys.argv)}")
    print(f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"{args.steps} steps of {BATCH} images at {SIZE} px, {args.intraop} intra-op threads, "
          f"autocast {args.autocast}, {args.reps} rounds\n")
    print("| student | step ms (median) | images/s | vs built-in |")
    print("|---|---:|---:|---:|")
    for arm, values in times.items():
        ms = statistics.median(values)
        ratio = 1.0 if arm == next(iter(configs)) else statistics.median(ratios)
        print(f"| {arm} | {ms:.1f} | {BATCH / ms * 1e3:.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
