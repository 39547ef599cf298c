"""apps/python/train_resnet.py: torchvision's resnet18 fed by a flowtrain graph, resumed."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "apps", "python", "train_resnet.py")


def test_the_example_trains_and_resumes(images, tmp_path):
    def train(steps):
        return subprocess.run(
            [sys.executable, SCRIPT, "--epochs", "1", "--steps", str(steps), "--out", str(tmp_path),
             f"stages.photos.params.manifest={images}/manifest.csv",
             "stages.decode_crop.params.batch_size=8", "stages.assemble_batch.params.batch_size=8"],
            capture_output=True, text=True, timeout=240, check=True).stdout

    first = train(2)
    assert "epoch 0: 16 photos" in first, first
    again = train(3)
    assert "resumed from" in again and "epoch 0, step 2" in again, again
    assert "epoch 0: 8 photos" in again, again  # the third batch only
