"""Fixtures of the Python package's tests: real JPEGs made by `flowtrain gen-images`, and a
graph over them (decode, augment, collate) written per test. ctest sets FLOWTRAIN_CLI and
PYTHONPATH (tests/CMakeLists.txt)."""

import os
import subprocess

import pytest

GRAPH = """\
threads: 2
stages:
  - {{type: image_folder, name: files, params: {{root: {root}, seed: 3, epochs: {epochs}}}}}
  - {{type: jpeg_decode, name: decode, concurrency: 2}}
{extra_sample}  - {{type: augment, concurrency: 2, params: {{size: {size}, scale: [0.5, 1.0]}}}}
  - {{type: collate, params: {{batch_size: {batch}, pool_size: {pool}}}}}
{extra_batch}  - {{type: discard, name: sink}}
"""


@pytest.fixture(scope="session")
def images(tmp_path_factory):
    """36 JPEGs of 64x48 in 3 classes."""
    root = tmp_path_factory.mktemp("images")
    subprocess.run([os.environ["FLOWTRAIN_CLI"], "gen-images", "--out", str(root), "--count",
                    "36", "--size", "64x48", "--classes", "3", "--seed", "5"],
                   check=True, stdout=subprocess.DEVNULL)
    return root


@pytest.fixture
def graph(images, tmp_path):
    """graph(batch=8, pool=3, size=32, epochs=4, extra_sample="", extra_batch="") -> a config."""

    def write(batch=8, pool=3, size=32, epochs=4, extra_sample="", extra_batch="",
              name="graph.yaml"):
        path = tmp_path / name
        path.write_text(GRAPH.format(root=images, batch=batch, pool=pool, size=size, epochs=epochs,
                                     extra_sample=extra_sample, extra_batch=extra_batch))
        return str(path)

    return write
