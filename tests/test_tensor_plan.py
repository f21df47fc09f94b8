"""Which layers tensor parallelism shards: torchtitan's Llama plan, by layer name."""

import pytest

from memcalc.distributed.tensor_plan import NoTensorPlan, tensor_layout, tensor_plan
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


def _layout(name: str, sequence: bool = True, loss: bool = True, **args):
    model = resolve_model(name, args).build_meta()
    return tensor_layout(model, repeated_blocks(model), sequence, loss)


LLAMA3 = dict(vocab=1000, dim=64, depth=2, heads=4, kv_heads=2, hidden=128)


def test_sequence_parallel_shards_the_residual_stream_as_torchtitan_does():
    """torchtitan's apply_tp: norms SequenceParallel, attention and MLP gather their input,
    the row-wise outputs and the embedding's sharded on the sequence, the head's input too."""
    layout = _layout("llama3_8b", **LLAMA3)
    styles = layout.styles
    assert layout.sequence_parallel and layout.loss_parallel
    for block in ("layers.0", "layers.1"):
        assert styles[f"{block}.attention_norm"] == styles[f"{block}.ffn_norm"] == "sequence"
        assert styles[f"{block}.attention"] == styles[f"{block}.feed_forward"] == "gather-input"
        assert styles[f"{block}.attention.wo"] == "rowwise-sequence"
        assert styles[f"{block}.feed_forward.w2"] == "rowwise-sequence"
        assert styles[f"{block}.attention.wq"] == "colwise"
    assert styles["norm"] == "sequence"
    assert styles["tok_embeddings"] == "embedding-sequence"
    assert styles["output"] == "head-sequence-loss-parallel"
    assert layout.describe() == "sequence parallel, loss parallel"


def test_each_of_sequence_and_loss_parallel_alone():
    loss_only = _layout("llama3_8b", sequence=False, **LLAMA3)
    assert loss_only.styles["output"] == "head-loss-parallel"
    assert loss_only.styles["layers.0.attention.wo"] == "rowwise"
    assert "norm" not in loss_only.styles
    sequence_only = _layout("llama3_8b", loss=False, **LLAMA3)
    assert sequence_only.styles["output"] == "head-sequence"
    plain = _layout("llama3_8b", sequence=False, loss=False, **LLAMA3)
    assert plain.styles == _plan("llama3_8b", **LLAMA3) and plain.describe() == ""


def test_a_tied_head_and_a_position_embedding_keep_the_stream_whole_and_say_why():
    layout = _layout("gpt2", vocab=1000, n_positions=64, dim=64, depth=2, heads=4)
    assert not layout.sequence_parallel and not layout.loss_parallel
    assert "tied" in layout.not_sequence_parallel and "tied" in layout.not_loss_parallel
    assert set(layout.styles.values()) <= {"colwise", "rowwise", "embedding-rowwise"}
