"""Weights in and out of flowtrain, checked against PyTorch and torchvision as peers: a torchvision
resnet18 state_dict saved by torch.save loads with `init:` and gives our ResNet torchvision's
logits; our trained ViT exported with `flowtrain export --layout torchvision` (as a state_dict and
as safetensors) loads strictly into torchvision's VisionTransformer with our TorchScript export's
logits. Runs the CLI that ctest passes as FLOWTRAIN_CLI (tests/CMakeLists.txt)."""

import json
import math
import os
import re
import subprocess

import pytest
import torch
import torchvision
from torchvision.models.vision_transformer import VisionTransformer

CLI = os.environ["FLOWTRAIN_CLI"]

TRAIN = """\
threads: 1
stages:
  - {{type: image_folder, name: source, params: {{root: {root}, epochs: 1, seed: 1}}}}
  - {{type: jpeg_decode}}
  - {{type: augment, params: {{size: 32, scale: [0.5, 1.0], seed: 1}}}}
  - {{type: collate, params: {{batch_size: 12}}}}
{teacher}  - type: train_step
    name: student
    params: {{classes: 3, image_size: 32, lr: 0.002, checkpoint_dir: {out}, {model}}}
"""


def flowtrain(*args):
    done = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def train(images, tmp_path, model):
    """Runs one epoch (3 steps) of train_step on the 36 test images; returns (final.pt, report)."""
    out = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(TRAIN.format(root=images, out=out, model="alpha: 1, " + model, teacher=""))
    report = flowtrain("run", config)
    assert (out / "final.pt").is_file(), report
    return out / "final.pt", report


def tolerance(logits, layers, fan_in):
    """Float32 rounding of `layers` sums of `fan_in` products each, growing as sqrt(fan_in) per
    layer (random-walk rounding) and adding up over the layers, relative to the logits' size."""
    eps = torch.finfo(torch.float32).eps
    return layers * eps * math.sqrt(fan_in) * max(1.0, logits.abs().max().item())


def read_safetensors(path):
    """A small safetensors reader (the `safetensors` package is not in Debian): 8-byte
    little-endian header length, JSON header {name: {dtype, shape, data_offsets}}, raw data."""
    dtypes = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16,
              "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32}
    blob = open(path, "rb").read()
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + size])
    data = blob[8 + size:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = bytearray(data[begin:end])
        tensor = torch.frombuffer(raw, dtype=dtypes[entry["dtype"]]) if raw else torch.empty(0)
        out[name] = tensor.reshape(entry["shape"]).clone()
    return out


def test_a_torchvision_resnet18_state_dict_gives_our_resnet_its_logits(images, tmp_path):
    torch.manual_seed(0)
    reference = torchvision.models.resnet18(num_classes=3)
    # Non-trivial BatchNorm statistics and affine weights, so that eval mode differs from train.
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.1, 0.1)
                module.num_batches_tracked.fill_(17)
    weights = tmp_path / "resnet18.pth"
    torch.save(reference.state_dict(), weights)

    # The stage loads it (the report counts the tensors); training then moves the weights on.
    checkpoint, report = train(images, tmp_path, f"model: resnet18, init: {weights}")
    assert re.search(r"init_loaded\W+122\b", report), report
    # The trained run's model with the file's weights, as TorchScript.
    scripted = tmp_path / "resnet18.pt"
    flowtrain("export", checkpoint, "--init", weights, "--out", scripted)
    ours = torch.jit.load(str(scripted))

    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    reference.eval()
    with torch.no_grad():
        expected = reference(x)
        got = ours(x)
        assert not torch.allclose(reference.train()(x), expected, atol=1e-3)  # stats matter
    tol = tolerance(expected, layers=18, fan_in=3 * 3 * 512)
    assert (got - expected).abs().max().item() <= tol, (got, expected)


@pytest.fixture(scope="module")
def trained_vit(images, tmp_path_factory):
    """A tiny ViT trained 3 steps, and its TorchScript export."""
    tmp_path = tmp_path_factory.mktemp("vit")
    checkpoint, _ = train(images, tmp_path,
                          "model: vit_ti, patch_size: 8, dim: 32, depth: 2, heads: 2")
    scripted = tmp_path / "vit.pt"
    flowtrain("export", checkpoint, "--out", scripted)
    return checkpoint, torch.jit.load(str(scripted)), tmp_path


def torchvision_vit(state_dict):
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                              hidden_dim=32, mlp_dim=128, num_classes=3)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def check_same_logits(model, scripted):
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = scripted(x)
        got = model(x)
    tol = tolerance(expected, layers=2 * 4 + 2, fan_in=128)
    assert (got - expected).abs().max().item() <= tol, (got, expected)


def check_read_back(checkpoint, weights, scripted, tmp_path):
    again = tmp_path / "again.pt"
    flowtrain("export", checkpoint, "--init", weights, "--out", again)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(torch.jit.load(str(again))(x), scripted(x))


def test_our_vit_as_a_torchvision_state_dict_loads_into_vision_transformer(trained_vit):
    checkpoint, scripted, tmp_path = trained_vit
    path = tmp_path / "vit_torchvision.pth"
    flowtrain("export", checkpoint, "--format", "state_dict", "--layout", "torchvision",
              "--out", path)
    check_same_logits(torchvision_vit(torch.load(path)), scripted)
    # ... and flowtrain reads it back (torchvision's names, LibTorch's pickle) to the same model.
    check_read_back(checkpoint, path, scripted, tmp_path)
    # The default layout holds our names: those of the TorchScript module, tensor for tensor.
    ours = tmp_path / "vit.pth"
    flowtrain("export", checkpoint, "--format", "state_dict", "--out", ours)
    loaded, expected = torch.load(ours), scripted.state_dict()
    assert list(loaded) == list(expected)
    assert all(torch.equal(loaded[k], expected[k]) for k in loaded)


def test_our_vit_as_safetensors_loads_into_vision_transformer(trained_vit):
    checkpoint, scripted, tmp_path = trained_vit
    path = tmp_path / "vit_torchvision.safetensors"  # the format from the extension
    flowtrain("export", checkpoint, "--layout", "torchvision", "--out", path)
    weights = read_safetensors(path)
    check_same_logits(torchvision_vit(weights), scripted)
    check_read_back(checkpoint, path, scripted, tmp_path)
    pickled = tmp_path / "vit_torchvision_2.pth"
    flowtrain("export", checkpoint, "--format", "state_dict", "--layout", "torchvision",
              "--out", pickled)
    assert all(torch.equal(weights[k], v) for k, v in torch.load(pickled).items())

