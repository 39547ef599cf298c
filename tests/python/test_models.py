"""flowtrain.models: plain-PyTorch definitions of flowtrain's ViT (with the distillation token)
and ResNet (of its own width) load `flowtrain export --format state_dict` strictly and give the
TorchScript export's outputs. Trained by the CLI that ctest passes as FLOWTRAIN_CLI."""

import math

import pytest
import torch
from test_torchscript_student import Teacher  # a small scripted teacher

import flowtrain.models
from test_weights import TRAIN, flowtrain as flowtrain_cli  # its training config, the CLI


def trained(images, tmp_path, model, teacher=False):
    """Trains 3 steps of `model` (train_step params), exports it: (state_dict, TorchScript)."""
    stage = ""
    if teacher:
        torch.manual_seed(0)
        path = tmp_path / "teacher.pt"
        torch.jit.script(Teacher().eval()).save(str(path))
        stage = f"  - {{type: teacher_infer, name: teacher, params: {{model: {path}}}}}\n"
    config = tmp_path / "train.yaml"
    config.write_text(TRAIN.format(root=images, out=tmp_path / "run", model=model, teacher=stage))
    flowtrain_cli("run", config)
    checkpoint = tmp_path / "run" / "final.pt"
    flowtrain_cli("export", checkpoint, "--format", "state_dict", "--out", tmp_path / "model.pth")
    flowtrain_cli("export", checkpoint, "--out", tmp_path / "model.pt")
    return torch.load(tmp_path / "model.pth"), torch.jit.load(str(tmp_path / "model.pt"))


def check_same_outputs(model, scripted, layers, fan_in):
    """The same logits as the TorchScript export, within float32 rounding of `layers` sums of
    `fan_in` products each (growing as sqrt(fan_in) a layer, adding up over the layers)."""
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected, got = scripted(x), model(x)
    eps = torch.finfo(torch.float32).eps
    tol = layers * eps * math.sqrt(fan_in) * max(1.0, expected.abs().max().item())
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= tol, (got, expected)


def test_a_vit_with_the_distillation_token_loads_and_infers_as_its_export(images, tmp_path):
    state, scripted = trained(images, tmp_path, "model: vit_ti, patch_size: 8, dim: 32, depth: 2, "
                              "heads: 2, distillation_token: true, alpha: 0.5", teacher=True)
    assert "dist_token" in state and "head_dist.weight" in state
    model = flowtrain.models.vit_from_state_dict(state, heads=2).eval()  # strict
    assert model.patch_embed.proj.kernel_size == (8, 8) and len(model.blocks) == 2
    check_same_outputs(model, scripted, layers=2 * 4 + 2, fan_in=128)
    # Training mode gives both heads, for a loss of one's own (DeiT's).
    logits, distillation = model.train()(torch.zeros(2, 3, 32, 32))
    assert logits.shape == distillation.shape == (2, 3)
    # A state_dict of another model is refused by name, as load_state_dict(strict=True) does.
    with pytest.raises(RuntimeError, match="Unexpected key"):
        flowtrain.models.ViT(32, 8, 32, 2, 2, 3).load_state_dict(state)


def test_a_resnet_of_its_own_width_loads_and_infers_as_its_export(images, tmp_path):
    state, scripted = trained(images, tmp_path, "model: resnet18, dim: 16, stage_blocks: [1, 2], "
                              "stem: compact, alpha: 1")
    model = flowtrain.models.resnet_from_state_dict(state).eval()
    assert [len(model.layer1), len(model.layer2)] == [1, 2] and model.conv1.kernel_size == (3, 3)
    check_same_outputs(model, scripted, layers=7, fan_in=3 * 3 * 32)
