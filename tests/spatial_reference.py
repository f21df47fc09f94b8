"""A real spatial-parallel training step on a gloo group, the truth for ``memcalc.spatial``.

Each rank holds one slab of every sample along the depth axis. Padded convolutions and
pools receive their halo rows from the neighbouring ranks by point-to-point messages
(``HaloExchange``, an autograd function that sends the halos' gradients back in backward);
weight gradients are all-reduced and averaged. ``halo_net`` has no normalisation, so the
slabs together reproduce the unsharded model exactly, which ``spatial_rank`` checks before
it measures its step with the profiler; the test and ``benchmarks.spatial`` compare that
with ``unsharded_peak_bytes`` and ``traced_bytes``.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from memcalc.measure_cpu import TrainingStep, measure_cpu_peak_bytes
from memcalc.optimizers import optimizer_rule
from memcalc.pipeline import estimate
from memcalc.spatial import apply_halo_exchange
from memcalc.specs import LossKind, TrainingSpec

DEPTH_AXIS = 2            # of the (batch, channels, depth, height, width) tensor
HALO_NET = "tests.spatial_reference:halo_net"


def halo_net() -> nn.Module:
    """Encoder-decoder over volumes: 'same' convs, a strided conv, a padded max pool, a
    transposed conv and a conv with two halo rows; no normalisation."""
    return nn.Sequential(
        nn.Conv3d(2, 8, 3, padding=1), nn.ReLU(),
        nn.Conv3d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.MaxPool3d(3, stride=1, padding=1),
        nn.ConvTranspose3d(16, 8, 2, stride=2), nn.ReLU(),
        nn.Conv3d(8, 3, (5, 3, 3), padding=(2, 1, 1)),
    )


def _swap(to_before: torch.Tensor, to_after: torch.Tensor, rank: int, world: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Send to the neighbouring ranks, receive theirs (zeros where there is no neighbour)."""
    from_before, from_after = torch.zeros_like(to_before), torch.zeros_like(to_after)
    requests = []
    if rank > 0:
        requests += [dist.isend(to_before, rank - 1), dist.irecv(from_before, rank - 1)]
    if rank < world - 1:
        requests += [dist.isend(to_after, rank + 1), dist.irecv(from_after, rank + 1)]
    for request in requests:
        request.wait()
    return from_before, from_after


class HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, slab, axis: int, rows: int, rank: int, world: int):
        ctx.axis, ctx.rows, ctx.rank, ctx.world = axis, rows, rank, world
        length = slab.size(axis)
        before, after = _swap(slab.narrow(axis, 0, rows).contiguous(),
                              slab.narrow(axis, length - rows, rows).contiguous(), rank, world)
        return torch.cat([before, slab, after], dim=axis)

    @staticmethod
    def backward(ctx, grad):
        axis, rows = ctx.axis, ctx.rows
        length = grad.size(axis) - 2 * rows
        back_before, back_after = _swap(grad.narrow(axis, 0, rows).contiguous(),
                                        grad.narrow(axis, rows + length, rows).contiguous(),
                                        ctx.rank, ctx.world)
        grad_slab = grad.narrow(axis, rows, length)
        grad_slab.narrow(axis, 0, rows).add_(back_before)
        grad_slab.narrow(axis, length - rows, rows).add_(back_after)
        return grad_slab, None, None, None, None


def exchanged_halos(rank: int, world: int):
    def pad(slab: torch.Tensor, axis: int, rows: int) -> torch.Tensor:
        return HaloExchange.apply(slab, axis, rows, rank, world)
    return pad


def _all_reduce_mean(parameter: torch.Tensor) -> None:
    dist.all_reduce(parameter.grad)
    parameter.grad /= dist.get_world_size()


def spatial_rank(rank: int, world: int, batch_shape: tuple[int, ...]) -> tuple:
    """On a gloo rank (``tests.gloo.run_ranks``): check the slabs against the unsharded model,
    then measure this rank's training step.

    Returns (rank, largest output error, largest gradient error, peak bytes)."""
    torch.manual_seed(0)
    full_model = halo_net()
    model = copy.deepcopy(full_model)
    apply_halo_exchange(model, DEPTH_AXIS, exchanged_halos(rank, world))
    batch = torch.randn(batch_shape)
    rows = batch_shape[DEPTH_AXIS] // world
    slab = batch.narrow(DEPTH_AXIS, rank * rows, rows).contiguous()

    full_output = full_model(batch)
    target = torch.randint(0, full_output.size(1), (batch_shape[0], *full_output.shape[2:]))
    F.cross_entropy(full_output, target).backward()
    output = model(slab)
    F.cross_entropy(output, target.narrow(1, rank * rows, rows)).backward()
    for parameter in model.parameters():
        _all_reduce_mean(parameter)
    output_error = (output - full_output.narrow(DEPTH_AXIS, rank * rows, rows)).abs().max()
    grad_error = max((p.grad - q.grad).abs().max().item()
                     for p, q in zip(model.parameters(), full_model.parameters(), strict=True))
    model.zero_grad(set_to_none=True)
    del full_model, full_output, output, batch, target

    for parameter in model.parameters():
        parameter.register_post_accumulate_grad_hook(_all_reduce_mean)
    step = TrainingStep(model, slab, LossKind.CROSS_ENTROPY, optimizer_rule("adam"),
                        classes_last=False)
    return rank, output_error.item(), grad_error, measure_cpu_peak_bytes(step)


def unsharded_peak_bytes(batch_shape: tuple[int, ...]) -> int:
    """The profiler peak of the unsharded step on the whole batch, same seed and weights."""
    torch.manual_seed(0)
    return measure_cpu_peak_bytes(TrainingStep(halo_net(), torch.randn(batch_shape),
                                               LossKind.CROSS_ENTROPY, optimizer_rule("adam"),
                                               classes_last=False))


def traced_bytes(batch_shape: tuple[int, ...], parts: int) -> int:
    """memcalc's CPU figure for one of ``parts`` ranks (1: the unsharded step)."""
    spec = TrainingSpec(model=HALO_NET, sample_shape=batch_shape[1:], device="cpu",
                        batch_size=batch_shape[0], spatial_parts=parts)
    return estimate(spec).device.total_bytes
