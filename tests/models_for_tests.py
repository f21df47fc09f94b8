"""User-style model factories for ``--model tests.models_for_tests:NAME`` tests."""

from torch import nn


def tiny_mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def not_a_module():
    return 42


class _ItemGate(nn.Module):
    """Data-dependent control flow: needs a real value, cannot run on fake tensors."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        if x.sum().item() > 0:
            return self.linear(x)
        return self.linear(-x)


def item_gate():
    return _ItemGate()


class _Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(64, 64)
        self.head = nn.Linear(64, 4)
        self.backbone.requires_grad_(False)

    def forward(self, x):
        return self.head(self.backbone(x))


def frozen_backbone():
    return _Frozen()


class _AttentionWithDropout(nn.Module):
    """One self-attention call with dropout, through F.scaled_dot_product_attention."""

    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, dim // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        return out.transpose(1, 2).reshape(batch, seq, dim)


def attention_with_dropout():
    return _AttentionWithDropout()


def single_conv3d():
    """One 3x3x3 convolution, 2 → 4 channels, no bias: FLOPs in closed form."""
    return nn.Conv3d(2, 4, kernel_size=3, padding=1, bias=False)


def single_linear():
    """One Linear(16 → 8) layer: what autograd saves is known in closed form."""
    return nn.Linear(16, 8)
