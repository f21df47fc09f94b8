"""Which layers tensor parallelism shards: torchtitan's Llama plan, by layer name."""

import pytest

from memcalc.distributed.tensor_plan import NoTensorPlan, tensor_plan
from memcalc.model.source import resolve_model
from memcalc.trace.checkpointing import repeated_blocks


def _plan(name: str, **args) -> dict[str, str]:
    model = resolve_model(name, args).build_meta()
    return tensor_plan(model, repeated_blocks(model))


def test_llama3_blocks_shard_attention_and_mlp_in_and_out():
    plan = _plan("llama3_8b", vocab=1000, dim=64, depth=2, heads=4, kv_heads=2, hidden=128)
    for block in ("layers.0", "layers.1"):
        for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1",
                     "feed_forward.w3"):
            assert plan[f"{block}.{name}"] == "colwise"
        for name in ("attention.wo", "feed_forward.w2"):
            assert plan[f"{block}.{name}"] == "rowwise"
    assert plan["tok_embeddings"] == "embedding-rowwise"
    assert plan["output"] == "head-colwise"
    assert len(plan) == 2 * 7 + 2


def test_a_head_tied_to_the_embedding_stays_replicated():
    plan = _plan("gpt2", vocab=1000, n_positions=64, dim=64, depth=2, heads=4)
    assert "lm_head" not in plan and "token_embedding" not in plan
    assert plan["position_embedding"] == "embedding-rowwise"
    assert plan["blocks.0.attention.qkv"] == "colwise"
    assert plan["blocks.0.mlp.proj"] == "rowwise"


def test_a_model_without_named_projections_is_refused():
    with pytest.raises(NoTensorPlan, match="drop --tp"):
        _plan("resnet50")
