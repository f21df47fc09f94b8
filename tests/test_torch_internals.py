"""The modes of ``memcalc.trace._torch_internals`` answer ``prim.device`` of a fake tensor as
torch itself does, without handing it on."""

import torch

from memcalc.trace._torch_internals import OpInterceptor, fake_cpu_mode, fake_device

DEVICE = torch.ops.prim.device.default


def test_a_fake_tensors_device_is_the_one_torch_gives():
    with fake_cpu_mode() as mode:
        tensor = torch.empty(3, 4)
    assert fake_device(DEVICE, (tensor,)) == tensor.device == torch.device("cpu")
    # inside a kernel the fake tensor is a meta tensor (FakeTensor.__torch_dispatch__)
    from torch._subclasses.fake_tensor import in_kernel_invocation_manager
    with in_kernel_invocation_manager(mode):
        assert fake_device(DEVICE, (tensor,)) == tensor.device == torch.device("meta")


def test_other_ops_and_real_tensors_are_not_answered():
    with fake_cpu_mode():
        tensor = torch.empty(2)
    assert fake_device(torch.ops.aten.add.Tensor, (tensor, tensor)) is None
    assert fake_device(DEVICE, (torch.empty(2),)) is None


def test_the_first_mode_answers_and_the_ones_below_never_see_it():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Below(TorchDispatchMode):
        """Every op that reaches it."""

        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    with fake_cpu_mode():
        tensor = torch.ones(5, requires_grad=True)
        with Below() as below, OpInterceptor(lambda func, args, kwargs: func(*args, **kwargs)):
            loss = (tensor * 2).sum()
            loss.backward()        # the autograd engine asks for .device from C++
            device = tensor.grad.device
    assert device == torch.device("cpu")
    assert torch.ops.aten.mul.Tensor in below.seen and DEVICE not in below.seen
    with fake_cpu_mode(), Below() as alone:     # without the interceptor it does see them
        tensor = torch.ones(5, requires_grad=True)
        (tensor * 2).sum().backward()
    assert DEVICE in alone.seen
