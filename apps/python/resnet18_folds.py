#!/usr/bin/python3
"""The PyTorch peer of `foodtag cv`: torchvision's resnet18, from scratch, on the same folds.

    build/apps/foodtag/foodtag cv                       # writes the folds and trains our models
    /usr/bin/python3 apps/python/resnet18_folds.py runs/foodtag/cv/5-folds-seed-1

Plain PyTorch, nothing of flowtrain: PIL decodes each fold's photos (fold-N/data/train.csv and
val.csv, which `foodtag cv` writes), torchvision's transforms make the views, and a textbook loop
trains the full-width ResNet-18 with the teacher's recipe in apps/foodtag/configs/foodtag.yaml:
96 px random-resized crops of scale 0.35-1 with flips and colour jitter 0.2, mixup 0.8 or cutmix
1.0, label smoothing 0.1, AdamW at 0.002 with weight decay 0.05, 20 warm-up steps and a cosine to
1e-5, batch 64, 100 epochs, bfloat16 autocast; labels only (no energy head). Each held-out photo
is centre-cropped at 96 from its short side resized to 110, as foodtag's evaluation does, and its
prediction goes to fold-N/predictions/pytorch_resnet18.csv (path,label,predicted: the columns of
foodtag's own); a fold whose file exists is kept, so an interrupted run goes on with the next
fold. Last, it prints the top-1 over all held-out photos with its 95% interval (Wilson's), the
folds' spread, and, where `foodtag cv` has evaluated its teacher, the two photo by photo (exact
McNemar), and writes them to pytorch_resnet18.txt beside folds.csv.
"""

import argparse
import csv
import math
import os
import random
import time

import torch
import torch.nn.functional as F
import torchvision
from PIL import Image
from torchvision import transforms

NAME = "pytorch_resnet18"
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def read_manifest(path):
    with open(path, newline="") as f:
        return [(row["path"], int(row["label"])) for row in csv.DictReader(f)]


def load(rows):
    """Every photo decoded once (they are 307x173), as uint8 CHW tensors."""
    to_tensor = transforms.PILToTensor()
    return [to_tensor(Image.open(path).convert("RGB")) for path, _ in rows]


def mix(images, labels, classes, alpha_mixup=0.8, alpha_cutmix=1.0):
    """Mixup or cutmix (half the batches each, as timm's switch_prob 0.5) with a flipped batch."""
    targets = F.one_hot(labels, classes).float()
    use_cutmix = random.random() < 0.5
    alpha = alpha_cutmix if use_cutmix else alpha_mixup
    lam = torch.distributions.Beta(alpha, alpha).sample().item()
    if use_cutmix:
        h, w = images.shape[-2:]
        cut_h, cut_w = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
        cy, cx = random.randrange(h), random.randrange(w)
        y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
        x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
        images = images.clone()
        images[..., y0:y1, x0:x1] = images.flip(0)[..., y0:y1, x0:x1]
        lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)
    else:
        images = lam * images + (1 - lam) * images.flip(0)
    return images, lam * targets + (1 - lam) * targets.flip(0)


def train_fold(train_rows, val_rows, classes, args, seed):
    random.seed(seed)
    torch.manual_seed(seed)
    train_images, val_images = load(train_rows), load(val_rows)
    train_labels = torch.tensor([label for _, label in train_rows])
    view = transforms.Compose([
        transforms.RandomResizedCrop(args.size, scale=(0.35, 1.0), antialias=True),
        transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.2, 0.2, 0.2),
        transforms.ConvertImageDtype(torch.float32),
        transforms.Normalize(MEAN, STD)])
    centre = transforms.Compose([
        transforms.Resize(round(args.size / 0.875), antialias=True),
        transforms.CenterCrop(args.size),
        transforms.ConvertImageDtype(torch.float32),
        transforms.Normalize(MEAN, STD)])

    model = torchvision.models.resnet18(num_classes=classes)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16")
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr)
    steps_per_epoch = math.ceil(len(train_rows) / args.batch)
    total, warmup = args.epochs * steps_per_epoch, 20

    def lr_at(step):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(total - warmup, 1)
        return 1e-5 + (args.lr - 1e-5) * 0.5 * (1 + math.cos(math.pi * progress))

    step, seen, start = 0, 0, time.monotonic()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(train_rows)).tolist()
        for first in range(0, len(order), args.batch):
            batch = order[first:first + args.batch]
            images = torch.stack([view(train_images[i]) for i in batch])
            images, targets = mix(images, train_labels[batch], classes)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            with autocast:
                loss = F.cross_entropy(model(images), targets, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step, seen = step + 1, seen + len(batch)
        if (epoch + 1) % 10 == 0 or epoch + 1 == args.epochs:
            wall = time.monotonic() - start
            print(f"  epoch {epoch + 1}/{args.epochs}: loss {loss.item():.3f}, "
                  f"{seen / wall:.0f} images/s", flush=True)

    model.eval()
    predicted = []
    with torch.no_grad(), autocast:
        for first in range(0, len(val_rows), 64):
            images = torch.stack([centre(image) for image in val_images[first:first + 64]])
            predicted += model(images).argmax(1).tolist()
    return predicted


def wilson(right, n, z=1.959964):
    p, d = right / n, 1 + z * z / n
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (p + z * z / (2 * n)) / d - half, (p + z * z / (2 * n)) / d + half


def mcnemar(only_a, only_b):
    """Exact two-sided McNemar: the binomial test of the discordant pairs at 1/2."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def read_predictions(path):
    with open(path, newline="") as f:
        return {row["path"]: row["label"] == row["predicted"] for row in csv.DictReader(f)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cv_dir", help="a folder `foodtag cv` wrote (with folds.csv, fold-N/)")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--autocast", choices=["bf16", "off"], default="bf16")
    parser.add_argument("--threads", type=int, default=2, help="torch's intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    folds = sorted((d for d in os.listdir(args.cv_dir) if d.startswith("fold-")),
                   key=lambda d: int(d[len("fold-"):]))
    if not folds:
        raise SystemExit(f"{args.cv_dir}: no fold-N folders; run `foodtag cv` first")
    begin = time.monotonic()
    ours, theirs, per_fold = {}, {}, []
    for fold in folds:
        data = os.path.join(args.cv_dir, fold, "data")
        out = os.path.join(args.cv_dir, fold, "predictions", NAME + ".csv")
        if not os.path.exists(out):
            train_rows = read_manifest(os.path.join(data, "train.csv"))
            val_rows = read_manifest(os.path.join(data, "val.csv"))
            with open(os.path.join(data, "labels.txt")) as f:
                classes = sum(1 for line in f if line.strip())
            print(f"{fold}: resnet18 from scratch on {len(train_rows)} photos, "
                  f"{len(val_rows)} held out", flush=True)
            fold_begin = time.monotonic()
            predicted = train_fold(train_rows, val_rows, classes, args,
                                   args.seed * 1000 + int(fold[len("fold-"):]))
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out + ".tmp", "w", newline="") as f:
                writer = csv.writer(f, lineterminator="\n")
                writer.writerow(["path", "label", "predicted"])
                writer.writerows((p, label, guess) for (p, label), guess in zip(val_rows, predicted))
            os.replace(out + ".tmp", out)
            print(f"{fold}: {time.monotonic() - fold_begin:.0f} s", flush=True)
        right = read_predictions(out)
        theirs.update(right)
        per_fold.append(sum(right.values()) / len(right))
        teacher = os.path.join(args.cv_dir, fold, "predictions", "teacher.csv")
        if os.path.exists(teacher):
            ours.update(read_predictions(teacher))

    n, right = len(theirs), sum(theirs.values())
    low, high = wilson(right, n)
    text = (f"{NAME}: {len(folds)} folds, {n} photos held out once: top-1 {100 * right / n:.1f}% "
            f"({100 * low:.1f}-{100 * high:.1f}), per fold {100 * min(per_fold):.1f}-"
            f"{100 * max(per_fold):.1f}; epochs {args.epochs}, seed {args.seed}\n")
    if ours.keys() == theirs.keys():
        only_ours = sum(ours[p] and not theirs[p] for p in ours)
        only_theirs = sum(theirs[p] and not ours[p] for p in ours)
        text += (f"foodtag's teacher against it on the same {n} photos: {100 * sum(ours.values()) / n:.1f}% "
                 f"against {100 * right / n:.1f}%, {only_ours} right only for the teacher, "
                 f"{only_theirs} only for {NAME}; p = {mcnemar(only_ours, only_theirs):.2g} (exact McNemar)\n")
    text += f"wall {time.monotonic() - begin:.0f} s\n"
    with open(os.path.join(args.cv_dir, NAME + ".txt"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
