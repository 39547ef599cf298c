"""A TorchScript student made in PyTorch and trained by train_step: the peer check against the
same steps in a plain PyTorch loop (same batches, AdamW, schedule, clipping, KD loss from a
fixed teacher), and the output contract's one-line errors."""

import math
import os
import subprocess

import pytest
import torch
import torch.nn.functional as F
import torchvision

import flowtrain

CLI = os.environ["FLOWTRAIN_CLI"]
LR, MIN_LR, WARMUP, WEIGHT_DECAY, CLIP = 0.01, 0.001, 1, 0.05, 1.0
ALPHA, T = 0.5, 2.0

CONFIG = """\
threads: 2
stages:
  - {{type: image_folder, name: files, params: {{root: {root}, seed: 3, epochs: 1}}}}
  - {{type: jpeg_decode, name: decode}}
  - {{type: augment, name: augment, params: {{size: 32, scale: [0.5, 1.0]}}}}
  - {{type: collate, name: collate, params: {{batch_size: 8, pool_size: 4}}}}
  - {{type: teacher_infer, name: teacher, params: {{model: {teacher}}}}}
  - type: train_step
    name: student
    params: {{model: {student}, classes: 3, image_size: 32, alpha: {alpha}, temperature: {t},
             lr: {lr}, min_lr: {min_lr}, warmup_steps: {warmup}, weight_decay: {wd},
             clip_grad_norm: {clip}, checkpoint_dir: {ckpt}{extra}}}
"""


class Teacher(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)).mean([2, 3]))


def save_scripted(module, path):
    torch.jit.script(module).save(str(path))
    return str(path)


@pytest.fixture
def setup(images, tmp_path):
    torch.manual_seed(0)
    teacher = save_scripted(Teacher().eval(), tmp_path / "teacher.pt")
    student = save_scripted(torchvision.models.resnet18(num_classes=3), tmp_path / "student.pt")

    def config(extra="", name="kd.yaml", student=student, checkpoints="ckpt"):
        path = tmp_path / name
        path.write_text(CONFIG.format(root=images, teacher=teacher, student=student, alpha=ALPHA,
                                      t=T, lr=LR, min_lr=MIN_LR, warmup=WARMUP, wd=WEIGHT_DECAY,
                                      clip=CLIP, ckpt=tmp_path / checkpoints, extra=extra))
        return str(path)

    return config, student, tmp_path


def scheduled_lr(step, total):
    """stages/train/step/optimizer.cpp's warm-up and cosine."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / (total - WARMUP)
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1 + math.cos(math.pi * progress))


def pytorch_steps(student_path, batches):
    # The eager torchvision model with the scripted file's initial weights.
    torch.set_num_threads(1)
    model = torchvision.models.resnet18(num_classes=3)
    model.load_state_dict(torch.jit.load(student_path).state_dict())
    model.train()
    params = list(model.named_parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for _, p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
         {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0}], lr=LR)
    for step, (images, labels, teacher) in enumerate(batches):
        for group in optimizer.param_groups:
            group["lr"] = scheduled_lr(step, len(batches))
        logits = model(images)
        kd = F.kl_div(F.log_softmax(logits / T, 1), F.log_softmax(teacher / T, 1),
                      reduction="batchmean", log_target=True)
        loss = ALPHA * F.cross_entropy(logits, labels) + (1 - ALPHA) * T * T * kd
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
    return model


def test_a_scripted_torchvision_model_trains_as_in_a_pytorch_loop(setup):
    config, student, tmp_path = setup
    # The batches train_step gets: the same config, tapped after the teacher.
    batches = [(b["images"].clone(), b["labels"].clone(), b["teacher_logits"].clone())
               for b in flowtrain.Loader(config(), output="teacher")]
    assert len(batches) == 5  # 36 photos, batch 8
    expected = pytorch_steps(student, batches)

    subprocess.run([CLI, "run", config()], check=True, capture_output=True)
    exported = str(tmp_path / "trained.pt")
    subprocess.run([CLI, "export", str(tmp_path / "ckpt" / "final.pt"), "--out", exported],
                   check=True, capture_output=True)
    trained = dict(torch.jit.load(exported).state_dict())
    # The same weights as a state_dict, which torchvision's own resnet18 loads strictly.
    state_dict = str(tmp_path / "trained.pth")
    subprocess.run([CLI, "export", str(tmp_path / "ckpt" / "final.pt"), "--format", "state_dict",
                    "--out", state_dict], check=True, capture_output=True)
    torchvision.models.resnet18(num_classes=3).load_state_dict(torch.load(state_dict))
    for name, value in torch.load(state_dict).items():
        assert torch.equal(value, trained[name]), name
    initial = dict(torch.jit.load(student).state_dict())
    reference = dict(expected.state_dict())
    assert trained.keys() == reference.keys()
    # The same ops of the same LibTorch, composed differently in places (AdamW's update, the
    # loss, clipping's norm; equal bit for bit on the machine this was written on, not promised
    # elsewhere): each weight may differ by rounding, far below one step's size (Adam moves a
    # weight by about lr per step), while every parameter moved by more than 1% of lr.
    for name, value in reference.items():
        if value.is_floating_point():
            difference = (trained[name] - value).abs().max().item()
            assert difference <= 1e-3 * LR, f"{name}: {difference}"
        else:
            assert torch.equal(trained[name], value), name  # num_batches_tracked
    # Every parameter moved by more than the tolerance (the buffers follow the data).
    moved = min((trained[n] - initial[n]).abs().max().item() for n, _ in expected.named_parameters())
    assert moved > 1e-2 * LR


def run_error(config):
    result = subprocess.run([CLI, "run", config], capture_output=True, text=True)
    assert result.returncode != 0
    return result.stderr.strip().splitlines()[-1]


class WrongClasses(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 5)

    def forward(self, x):
        return self.fc(x.mean([2, 3]))


class Named(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        return {"logits": self.fc(x.mean([2, 3])), "energy": x.mean([1, 2, 3])}


@pytest.mark.parametrize("module, expected", [
    (WrongClasses(), "forward returned logits [8, 5], expected [8, 3] (classes: 3)"),
    (Named(), "forward returned a dict whose 'energy' is Tensor[8], expected 'logits'"),
])
def test_an_output_outside_the_contract_is_one_line_naming_the_file(setup, module, expected):
    config, _, tmp_path = setup
    bad = save_scripted(module, tmp_path / "bad.pt")
    line = run_error(config(name="bad.yaml", student=bad))
    assert bad in line and expected in line, line


def test_a_scripted_student_refuses_pipeline_partitions_and_shape_params(setup):
    config, student, _ = setup
    line = run_error(config(", partitions: 2", name="p.yaml"))
    assert "param 'partitions': a TorchScript model" in line and student in line, line
    line = run_error(config(", depth: 4", name="d.yaml"))
    assert "depth does not apply" in line, line


def test_a_model_that_is_neither_a_preset_nor_a_file_is_refused(setup):
    config, _, tmp_path = setup
    line = run_error(config(name="m.yaml", student="resnet81"))
    assert "must be one of vit_ti" in line and "or a file that exists, got" in line, line


def test_a_scripted_student_resumes_exactly_on_two_ranks_with_zero_ema_and_bf16(setup):
    # mobilenet_v3_small: dropout in its classifier, so the resumed random state matters too.
    config, _, tmp_path = setup
    torch.manual_seed(1)
    student = save_scripted(torchvision.models.mobilenet_v3_small(num_classes=3),
                            tmp_path / "mobilenet.pt")
    extra = ", zero: 1, ema_decay: 0.9, autocast: bf16, checkpoint_every: 2, resume: true"
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    for folder in (whole, stopped):
        path = config(extra, name=f"{folder.name}.yaml", student=student, checkpoints=folder.name)
        subprocess.run([CLI, "run", "--nproc", "2", path], check=True, capture_output=True)
    # `stopped` loses everything after step 2, as a run killed there would, and resumes.
    for f in stopped.iterdir():
        if f.name.startswith(("final.pt", "step-00000004.pt")):
            f.unlink()
    result = subprocess.run([CLI, "run", "--nproc", "2", str(tmp_path / "stopped.yaml")],
                            check=True, capture_output=True, text=True)
    assert "resumed_at 2" in result.stdout
    exported = {}
    for folder in (whole, stopped):
        out = tmp_path / f"{folder.name}-export.pt"
        subprocess.run([CLI, "export", str(folder / "final.pt"), "--out", str(out)], check=True,
                       capture_output=True)
        exported[folder.name] = torch.jit.load(str(out)).state_dict()
    assert exported["whole"].keys() == exported["stopped"].keys()
    for name, value in exported["whole"].items():
        assert torch.equal(value, exported["stopped"][name]), name


class MaxPooled(Teacher):  # Teacher's parameters, another forward
    def forward(self, x):
        return self.fc(F.relu(self.conv(x)).amax([2, 3]))


def test_a_checkpoint_knows_its_scripted_student_by_its_code_not_its_path(setup):
    # Moved, the same file resumes; another module in its place (the same parameters, another
    # forward) is refused by resume and by export, naming the file.
    config, _, tmp_path = setup
    first = save_scripted(Teacher(), tmp_path / "pooled.pt")
    extra = ", checkpoint_every: 2, resume: true"
    subprocess.run([CLI, "run", config(extra, name="a.yaml", student=first)], check=True,
                   capture_output=True)

    def lose_all_after_step_2():
        for f in (tmp_path / "ckpt").iterdir():
            if f.name.startswith("final.pt") or (f.name.startswith("step-")
                                                 and f.name > "step-00000002.pt"):
                f.unlink()

    lose_all_after_step_2()
    (tmp_path / "moved").mkdir()
    moved = str(tmp_path / "moved" / "pooled.pt")
    os.rename(first, moved)
    result = subprocess.run([CLI, "run", config(extra, name="b.yaml", student=moved)],
                            capture_output=True, text=True)
    assert result.returncode == 0 and "resumed_at 2" in result.stdout, result.stderr

    lose_all_after_step_2()
    save_scripted(MaxPooled(), moved)
    line = run_error(config(extra, name="b.yaml", student=moved))
    assert f"the code of {moved} is not that of the module it trained, from {first}" in line, line
    save_scripted(MaxPooled(), first)
    result = subprocess.run([CLI, "export", str(tmp_path / "ckpt" / "step-00000002.pt"), "--out",
                             str(tmp_path / "out.pt")], capture_output=True, text=True)
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode != 0 and f"{first}: its code is not that of the module" in line, line
