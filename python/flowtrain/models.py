"""flowtrain's built-in models as plain PyTorch modules (stages/train/models): the ViT, with
DeiT's distillation token and a regression head, and the ResNet of any width. Their parameter
names are flowtrain's, so a state_dict that `flowtrain export CHECKPOINT --format state_dict`
writes (or its safetensors) loads strictly, and in eval mode they give the outputs of the
TorchScript export of the same checkpoint, op for op, up to float rounding.

    import torch
    import flowtrain.models

    state = torch.load("student.pth")   # flowtrain export runs/foodtag/student/final.pt \\
                                        #   --format state_dict --out student.pth
    model = flowtrain.models.vit_from_state_dict(state, heads=3, regression_scale=100).eval()
    logits, energy = model(images)      # [B, 20], [B, 1] (a model without regression: logits)

The shapes come from the state_dict; what it cannot hold is asked for: a ViT's `heads`, and the
`regression_scale` of a model with a regression head (train_step's params of those names).
"""

import math
import re

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ViT", "ResNet", "vit_from_state_dict", "resnet_from_state_dict"]

# timm's LayerNorm epsilon for ViT, as flowtrain's (PyTorch's default is 1e-5).
LAYER_NORM_EPS = 1e-6


class PatchEmbed(nn.Module):
    def __init__(self, channels, dim, patch):
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, patch, stride=patch)

    def forward(self, images):
        return self.proj(images).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.scale = 1.0 / math.sqrt(dim // heads)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attention = torch.matmul(q * self.scale, k.transpose(-2, -1)).softmax(-1)
        return self.proj(torch.matmul(attention, v).transpose(1, 2).reshape(batch, tokens, dim))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) GELU


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.mlp = Mlp(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """flowtrain's `vit` (train_step's `model: vit_ti` and kin), without dropout or drop path.

    forward(images [B, channels, image_size, image_size]) gives the class logits, or
    (logits, regression) with a regression head. With the distillation token, eval mode's logits
    are the mean of the class and distillation heads (as DeiT and flowtrain infer), and training
    mode gives (class logits, distillation logits) in their place, for a loss of your own.
    """

    def __init__(self, image_size, patch_size, dim, depth, heads, classes, mlp_hidden=None,
                 channels=3, distillation_token=False, regression_outputs=0,
                 regression_scale=1.0):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        patches = (image_size // patch_size) ** 2
        self.image_size, self.channels = image_size, channels
        self.regression_scale = regression_scale
        self.patch_embed = PatchEmbed(channels, dim, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim)) if distillation_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, (2 if distillation_token else 1) + patches, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads, mlp_hidden or 4 * dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.head = nn.Linear(dim, classes)
        self.head_dist = nn.Linear(dim, classes) if distillation_token else None
        self.regression_head = (nn.Linear(dim, regression_outputs) if regression_outputs > 0
                                else None)

    def forward(self, images):
        x = self.patch_embed(images)
        tokens = [self.cls_token.expand(x.size(0), -1, -1)]
        if self.dist_token is not None:
            tokens.append(self.dist_token.expand(x.size(0), -1, -1))
        x = self.blocks(torch.cat(tokens + [x], 1) + self.pos_embed)
        features = self.norm(x.select(1, 0))
        logits = self.head(features)
        if self.head_dist is not None:
            distillation = self.head_dist(self.norm(x.select(1, 1)))
            logits = (logits, distillation) if self.training else (logits + distillation) / 2
        if self.regression_head is None:
            return logits
        return logits, self.regression_head(features) * self.regression_scale


class BasicBlock(nn.Module):
    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, 0, bias=False),
                                            nn.BatchNorm2d(outputs))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """flowtrain's `resnet` (train_step's `model: resnet18` with its `dim`, `stage_blocks` and
    `stem`): basic blocks, stage s `dim * 2**s` wide; the `imagenet` stem (7x7 convolution,
    stride 2, and a max pool) or the `compact` one (3x3, stride 2, no pool). forward gives the
    logits, or (logits, regression) with a regression head. At dim 64, stage_blocks [2, 2, 2, 2]
    and the imagenet stem it is torchvision's resnet18, names included."""

    def __init__(self, dim, stage_blocks, classes, channels=3, stem="imagenet",
                 regression_outputs=0, regression_scale=1.0):
        super().__init__()
        if stem not in ("imagenet", "compact"):
            raise ValueError(f"stem must be imagenet or compact, got {stem!r}")
        kernel, padding = (7, 3) if stem == "imagenet" else (3, 1)
        self.stem_pool = stem == "imagenet"
        self.regression_scale = regression_scale
        self.conv1 = nn.Conv2d(channels, dim, kernel, 2, padding, bias=False)
        self.bn1 = nn.BatchNorm2d(dim)
        inputs = dim
        for s, blocks in enumerate(stage_blocks):
            width = dim << s
            layer = []
            for b in range(blocks):
                layer.append(BasicBlock(inputs, width, 2 if b == 0 and s > 0 else 1))
                inputs = width
            self.add_module(f"layer{s + 1}", nn.Sequential(*layer))
        self.layers = len(stage_blocks)
        self.fc = nn.Linear(inputs, classes)
        self.regression_head = (nn.Linear(inputs, regression_outputs) if regression_outputs > 0
                                else None)

    def forward(self, images):
        x = F.relu(self.bn1(self.conv1(images)))
        if self.stem_pool:
            x = F.max_pool2d(x, 3, 2, 1)
        for s in range(self.layers):
            x = getattr(self, f"layer{s + 1}")(x)
        features = x.mean((2, 3))
        logits = self.fc(features)
        if self.regression_head is None:
            return logits
        return logits, self.regression_head(features) * self.regression_scale


def _blocks(state_dict, prefix):
    """The indices N of `prefix`N. keys."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    return sorted({int(m.group(1)) for k in state_dict for m in [pattern.match(k)] if m})


def vit_from_state_dict(state_dict, heads, regression_scale=1.0, strict=True):
    """A ViT shaped as `state_dict` says (flowtrain's names), with its weights loaded. `heads`
    (train_step's param) cannot be read from the weights; `regression_scale` is train_step's
    too (foodtag's: 100), for a model with a regression head."""
    dim = state_dict["pos_embed"].shape[-1]
    weight = state_dict["patch_embed.proj.weight"]  # [dim, channels, patch, patch]
    distillation = "dist_token" in state_dict
    patches = state_dict["pos_embed"].shape[1] - (2 if distillation else 1)
    side = math.isqrt(patches)
    regression = state_dict.get("regression_head.weight")
    model = ViT(image_size=side * weight.shape[-1], patch_size=weight.shape[-1], dim=dim,
                depth=len(_blocks(state_dict, "blocks.")), heads=heads,
                classes=state_dict["head.weight"].shape[0],
                mlp_hidden=state_dict["blocks.0.mlp.fc1.weight"].shape[0],
                channels=weight.shape[1], distillation_token=distillation,
                regression_outputs=0 if regression is None else regression.shape[0],
                regression_scale=regression_scale)
    model.load_state_dict(state_dict, strict=strict)
    return model


def resnet_from_state_dict(state_dict, regression_scale=1.0, strict=True):
    """A ResNet shaped as `state_dict` says (flowtrain's names, which are torchvision's), with
    its weights loaded; `regression_scale` as for vit_from_state_dict."""
    stem = state_dict["conv1.weight"]  # [dim, channels, k, k]
    stages, s = [], 1
    while _blocks(state_dict, f"layer{s}."):
        stages.append(len(_blocks(state_dict, f"layer{s}.")))
        s += 1
    regression = state_dict.get("regression_head.weight")
    model = ResNet(dim=stem.shape[0], stage_blocks=stages, classes=state_dict["fc.weight"].shape[0],
                   channels=stem.shape[1], stem="imagenet" if stem.shape[-1] == 7 else "compact",
                   regression_outputs=0 if regression is None else regression.shape[0],
                   regression_scale=regression_scale)
    model.load_state_dict(state_dict, strict=strict)
    return model
