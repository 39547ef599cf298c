"""Every Python block of docs/python.md and docs/models.md runs as written, in order, in one
namespace per page, in a folder holding the files the page says where they come from: the
photos (the test's JPEGs), configs, and models trained by flowtrain. The `flowtrain export`
commands a page gives (in a shell block, or as a block's comment) are run as written first."""

import csv
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import torch
import torchvision

ROOT = Path(__file__).resolve().parents[2]
CLI = os.environ["FLOWTRAIN_CLI"]

GRAPH = """\
threads: 2
stages:
  - {{type: image_folder, name: files, params: {{root: {root}, seed: 3, epochs: 4}}}}
  - {{type: jpeg_decode, name: decode, concurrency: 2}}
  - {{type: augment, concurrency: 2, params: {{size: 32, scale: [0.5, 1.0]}}}}
  - {{type: collate, params: {{batch_size: 8, pool_size: 3}}}}
  - {{type: discard, name: sink}}
"""

# A model trained by flowtrain where a page names a run folder: `checkpoint_dir` from `params`.
TRAIN = """\
threads: 1
stages:
  - {{type: csv_manifest, name: source, params: {{manifest: {manifest}, epochs: 1, seed: 1}}}}
  - {{type: jpeg_decode}}
  - {{type: augment, params: {{size: {size}, scale: [0.5, 1.0], seed: 1}}}}
  - {{type: collate, params: {{batch_size: 12}}}}
  - type: train_step
    name: student
    params: {{image_size: {size}, alpha: 1, lr: 0.002, {params}}}
"""


def flowtrain(*args, cwd):
    done = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd)
    assert done.returncode == 0, " ".join(map(str, args)) + "\n" + done.stdout + done.stderr
    return done.stdout


def blocks(page, language):
    return re.findall(r"```" + language + r"\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)


def run_exports(text, cwd):
    """The `flowtrain export ...` commands of `text` (a shell block, or a block's comments)."""
    for line in text.splitlines():
        command = re.match(r"\s*#?\s*(flowtrain export [^#]*)", line)
        if command:
            flowtrain(*shlex.split(command.group(1))[1:], cwd=cwd)


def run_block(code, namespace, name):
    exec(compile(code, name, "exec"), namespace)


def manifest_with_targets(images, path):
    """The test's photos as a manifest of absolute paths, with an energy target per photo."""
    with open(images / "manifest.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["path", "label", "energy"])
        for i, row in enumerate(rows):
            out.writerow([images / row["path"], row["label"], 100 + 10 * i])
    return path


def train(cwd, manifest, size, params):
    config = cwd / "train.yaml"
    config.write_text(TRAIN.format(manifest=manifest, size=size, params=params))
    flowtrain("run", config, cwd=cwd)


def test_python_md_runs_as_written(images, tmp_path, monkeypatch):
    # The repository's photo graph, reading its manifest where scripts/fetch-pictures writes it.
    (tmp_path / "apps" / "python").mkdir(parents=True)
    shutil.copy(ROOT / "apps" / "python" / "photos.yaml", tmp_path / "apps" / "python")
    (tmp_path / "data" / "ifct2017").mkdir(parents=True)
    manifest_with_targets(images, tmp_path / "data" / "ifct2017" / "manifest.csv")
    (tmp_path / "graph.yaml").write_text(GRAPH.format(root=images))
    monkeypatch.chdir(tmp_path)
    namespace = {}
    code = blocks("python.md", "python")
    assert len(code) >= 4
    for i, block in enumerate(code):
        run_block(block, namespace, f"docs/python.md, python block {i + 1}")
    assert namespace["loader"] is not None and "cutout" in namespace


def test_models_md_runs_as_written(images, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = blocks("models.md", "python")
    namespace = {}
    # End to end: "your trained weights", then the page's graph and export commands.
    torch.save(torchvision.models.resnet50(num_classes=20).state_dict(), "my_teacher.pth")
    run_block(code[0], namespace, "docs/models.md, python block 1")
    (tmp_path / "photos").symlink_to(images)
    (tmp_path / "distil.yaml").write_text(blocks("models.md", "yaml")[0])
    flowtrain("run", "distil.yaml", "stages.image_folder.params.epochs=1", cwd=tmp_path)
    exports = re.search(r"\*\*3\. Back to PyTorch\.\*\*.*?```\n(.*?)```",
                        (ROOT / "docs" / "models.md").read_text(), re.S).group(1)
    run_exports(exports, tmp_path)
    run_block(code[1], namespace, "docs/models.md, python block 2")
    run_block(code[2], namespace, "docs/models.md, python block 3")
    # runs/kd/student: kd.yaml's student shape (64 px, patch 8, 2 blocks of 96, 3 heads, 10
    # classes); runs/foodtag/teacher: a ResNet with an energy head, scaled as foodtag's.
    manifest = manifest_with_targets(images, tmp_path / "manifest.csv")
    train(tmp_path, manifest, 64,
          "model: vit_ti, classes: 10, patch_size: 8, dim: 96, depth: 2, heads: 3, "
          "checkpoint_dir: runs/kd/student")
    train(tmp_path, manifest, 96,
          "model: resnet18, dim: 8, classes: 20, regression_outputs: 1, regression_scale: 100, "
          "checkpoint_dir: runs/foodtag/teacher")
    flowtrain("export", "runs/kd/student/final.pt", "--layout", "torchvision", "--out",
              "vit.safetensors", cwd=tmp_path)
    for i, block in enumerate(code[3:], start=4):
        run_exports(block, tmp_path)
        run_block(block, namespace, f"docs/models.md, python block {i}")
    assert len(code) == 6
    logits, energy = namespace["logits"], namespace["energy"]
    assert logits.shape == (1, 20) and energy.shape == (1, 1)
