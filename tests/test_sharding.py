"""ZeRO / FSDP / DDP per-GPU states against the closed forms of the ZeRO paper."""

import pytest

from memcalc.model.source import resolve_model
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.strategies.sharding import (
    ModelStates,
    ddp_bucket_bytes,
    gathered_unit_bytes,
    largest_unit_fraction,
    sharded_state_bytes,
)
from tests.fixtures.gloo import run_ranks

TINY_GPT2 = dict(vocab=1000, n_positions=64, dim=64, depth=4, heads=4)


@pytest.fixture(scope="module")
def mixed_adam_states():
    """States of a mixed-precision Adam run as memcalc counts them (fp32 master weights)."""
    report = estimate(TrainingSpec(model="gpt2", model_args=TINY_GPT2, sample_shape=(64,),
                                   precision="bf16-mixed", batch_size=1))
    static = report.static
    return report.model.parameter_count, ModelStates(
        static.parameter_bytes, static.gradient_bytes, static.optimizer_state_bytes, 0)


@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_zero_stages_match_the_paper(mixed_adam_states, ranks):
    params, states = mixed_adam_states
    assert states.total_bytes == 16 * params          # 4 (fp32) + 4 (grad) + 8 (Adam m, v)
    assert sharded_state_bytes(states, ranks, 3) == pytest.approx(16 * params / ranks, abs=3)
    assert sharded_state_bytes(states, ranks, 2) == pytest.approx(4 * params + 12 * params / ranks,
                                                                  abs=3)
    assert sharded_state_bytes(states, ranks, 1) == pytest.approx(8 * params + 8 * params / ranks,
                                                                  abs=3)
    assert sharded_state_bytes(states, ranks, 0) == 16 * params


def test_ddp_buckets_copy_the_gradients_unless_they_are_views(mixed_adam_states):
    params, states = mixed_adam_states
    assert ddp_bucket_bytes(states, gradient_as_bucket_view=False) == 4 * params
    assert ddp_bucket_bytes(states, gradient_as_bucket_view=True) == 0


def test_fsdp_units_are_blocks_and_the_root():
    model = resolve_model("gpt2", TINY_GPT2).build_meta()
    total = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.blocks[0].parameters())
    root = total - 4 * block                        # embeddings, final norm (head tied)
    assert largest_unit_fraction(model) == pytest.approx(max(root, block) / total)
    states = ModelStates(400, 400, 800, 100)
    assert gathered_unit_bytes(states, 3) == 2 * 100 + 100
    assert gathered_unit_bytes(states, 2) == 0


def _fsdp2_rank(rank: int, world: int) -> tuple[int, int, int, int]:
    """One gloo rank: FSDP2 (fully_shard per block + root), one Adam step; its local bytes."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = resolve_model("gpt2", TINY_GPT2).factory(**TINY_GPT2)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randint(0, 100, (2, 64))).float().mean().backward()
    optimizer.step()

    def local_bytes(tensor) -> int:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        return local.numel() * local.element_size()

    return (rank,
            sum(local_bytes(p) for p in model.parameters()),
            sum(local_bytes(p.grad) for p in model.parameters()),
            sum(local_bytes(value) for state in optimizer.state.values()
                for key, value in state.items() if key != "step"))


@pytest.mark.slow
def test_fsdp2_on_gloo_holds_the_zero3_share_of_every_state():
    world = 2
    measured = run_ranks(_fsdp2_rank, world)
    report = estimate(TrainingSpec(model="gpt2", model_args=TINY_GPT2, sample_shape=(64,),
                                   device="cpu", batch_size=2))
    static = report.static
    states = ModelStates(static.parameter_bytes, static.gradient_bytes,
                         static.optimizer_state_bytes, 0)
    for _, parameters, gradients, optimizer_state in measured:
        assert parameters == pytest.approx(static.parameter_bytes / world, rel=0.01)
        assert gradients == pytest.approx(static.gradient_bytes / world, rel=0.01)
        assert optimizer_state == pytest.approx(static.optimizer_state_bytes / world, rel=0.01)
        assert parameters + gradients + optimizer_state == pytest.approx(
            sharded_state_bytes(states, world, 3), rel=0.01)
