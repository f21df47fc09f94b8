"""Step time from FLOPs and the GPU catalog; communication volume over the interconnect.

Compute time is ``memcalc.device.speed``'s. Collectives follow NCCL's ring
costs: all-reduce moves 2(N−1)/N of the bytes per GPU, all-gather and reduce-scatter
(N−1)/N each. Communication is not overlapped with compute (an upper bound).
"""

from __future__ import annotations

from memcalc.strategies.specs import INTERCONNECT_GBPS, ClusterSpec, Interconnect

HOST_LINK_BYTES_PER_S = 25e9
"""PCIe 4.0 x16 between GPU and pinned host memory, one direction."""


def bandwidth_bytes_per_s(cluster: ClusterSpec, gpus: int) -> float:
    """Across nodes the slower InfiniBand link sets the pace."""
    link = cluster.interconnect
    if gpus > cluster.gpus_per_node_for(gpus):
        link = Interconnect.INFINIBAND
    return INTERCONNECT_GBPS[link] * 1e9


def all_reduce_seconds(nbytes: int, gpus: int, bandwidth: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``gpus``: 2(N−1)/N of the bytes per GPU."""
    return 2 * (gpus - 1) / gpus * nbytes / bandwidth if gpus > 1 else 0.0


def fsdp_seconds(parameter_bytes: int, gradient_bytes: int, gpus: int, bandwidth: float) -> float:
    """All-gather parameters in forward and again in backward, reduce-scatter gradients."""
    if gpus == 1:
        return 0.0
    return (gpus - 1) / gpus * (2 * parameter_bytes + gradient_bytes) / bandwidth
