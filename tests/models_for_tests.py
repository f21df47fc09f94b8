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


class _Untraceable(nn.Module):
    """A linear layer behind one operation fake tensors cannot run (``kind``)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        import torch

        if self.kind == "numpy":                 # leaves torch for numpy
            x = torch.from_numpy(x.detach().numpy() * 2)
        elif self.kind == "nonzero":              # output shape depends on the values
            x = x[x.nonzero(as_tuple=True)].reshape(x.shape)
        elif self.kind == "tolist":               # Python values out of a tensor
            x = x * float(len([v for v in x.flatten().tolist() if v > 0]))
        elif self.kind == "custom_op":            # a custom op without a fake kernel
            x = torch.ops.memcalc_tests.opaque(x)
        elif self.kind == "cuda_only":            # an extension that insists on CUDA
            x = x.cuda()
        return self.linear(x)


def _register_opaque_op():
    import torch

    if not hasattr(torch.ops.memcalc_tests, "opaque"):
        library = torch.library.Library("memcalc_tests", "DEF")
        library.define("opaque(Tensor x) -> Tensor")
        library.impl("opaque", lambda x: x * 2, "CPU")
        _register_opaque_op.library = library   # keep the registration alive


def untraceable(kind: str = "numpy"):
    if kind == "custom_op":
        _register_opaque_op()
    return _Untraceable(kind)


class _Crashing(nn.Module):
    """Kills its own process in forward, as a broken C extension would."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)


def crashing():
    return _Crashing()


class _Hanging(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        import time

        time.sleep(3600)


def hanging():
    return _Hanging()


class _ConvThenLinear(nn.Module):
    """A convolution whose output is flattened into a linear layer of fixed width: traces on
    its own shape, not on a spatial slab of it."""

    def __init__(self, depth=64, side=32):
        super().__init__()
        self.conv = nn.Conv3d(1, 8, 3, padding=1)
        self.head = nn.Linear(8 * depth * side * side, 2)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))


def conv_then_linear():
    return _ConvThenLinear()
