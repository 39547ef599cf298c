"""apps/python/resnet18_folds.py: the PyTorch peer of `foodtag cv`, on a small cv folder."""

import csv
import os
import subprocess
import sys

from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "apps", "python", "resnet18_folds.py")


def write_cv_folder(root, folds=2, per_class=6, classes=3):
    """The layout `foodtag cv` writes: fold-N/data/{train,val}.csv with absolute paths, and
    labels.txt; photo k of each class is held out by fold k % folds + 1."""
    photos = []
    for label in range(classes):
        for k in range(per_class):
            path = root / "photos" / f"{label}-{k}.jpeg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (80, 60), (80 * label, 40 * k, 120)).save(path)
            photos.append((str(path), label, k % folds + 1))
    for fold in range(1, folds + 1):
        data = root / f"fold-{fold}" / "data"
        data.mkdir(parents=True)
        for name, held_out in (("train.csv", False), ("val.csv", True)):
            with open(data / name, "w", newline="") as f:
                writer = csv.writer(f, lineterminator="\n")
                writer.writerow(["path", "label", "energy_kcal"])
                writer.writerows((p, label, 100.0) for p, label, f_of in photos
                                 if (f_of == fold) == held_out)
        (data / "labels.txt").write_text("".join(f"group {c}\n" for c in range(classes)))
    return photos


def run(cv_dir):
    return subprocess.run(
        [sys.executable, SCRIPT, str(cv_dir), "--epochs", "2", "--batch", "4", "--size", "64",
         "--threads", "1"], capture_output=True, text=True, timeout=240, check=True).stdout


def test_every_photo_is_predicted_once_and_a_done_fold_is_kept(tmp_path):
    photos = write_cv_folder(tmp_path)
    first = run(tmp_path)
    assert first.count("resnet18 from scratch on 9 photos, 9 held out") == 2, first
    # Then foodtag's teacher, right on every photo: the comparison counts the photos only it
    # got right.
    predicted, right = {}, 0
    for fold in (1, 2):
        predictions = tmp_path / f"fold-{fold}" / "predictions"
        with open(predictions / "pytorch_resnet18.csv") as f:
            rows = list(csv.DictReader(f))
        assert all(0 <= int(row["predicted"]) < 3 for row in rows), rows
        for row in rows:
            assert row["path"] not in predicted
            predicted[row["path"]] = int(row["label"])
        right += sum(row["label"] == row["predicted"] for row in rows)
        with open(predictions / "teacher.csv", "w") as f:
            f.write("path,label,predicted\n" + "".join(
                f"{row['path']},{row['label']},{row['label']}\n" for row in rows))
    assert predicted == {p: label for p, label, _ in photos}
    assert "2 folds, 18 photos held out once: top-1" in first, first
    assert "teacher against it" not in first  # no teacher predictions then
    again = run(tmp_path)
    assert "resnet18 from scratch" not in again, again  # both folds kept
    assert f"{18 - right} right only for the teacher, 0 only for pytorch_resnet18" in again, again
    assert (tmp_path / "pytorch_resnet18.txt").read_text() in again
