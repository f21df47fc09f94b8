"""Which stream a traced allocation is made on (``memcalc.trace.streams``)."""

import math
from collections import defaultdict

import torch

from memcalc.distributed.specs import ParallelSpec
from memcalc.pipeline import _prepare
from memcalc.specs import TrainingSpec
from memcalc.trace.streams import StreamNumbers
from models_zoo import ZOO
from tests.fixtures.distributed_truth import TINY_GPT2


def test_streams_are_numbered_in_the_order_they_are_met():
    numbers, first, second = StreamNumbers(), torch.cpu.Stream(), torch.cpu.Stream()
    assert numbers.current() == 0
    with torch.cpu.stream(second):
        assert numbers.current() == 1
        with torch.cpu.stream(first):
            assert numbers.current() == 2
    with torch.cpu.stream(second):
        assert numbers.current() == 1
    assert numbers.current() == 0


def test_an_fsdp_rank_makes_its_sharded_gradients_on_the_reduce_scatter_stream():
    # FSDP2 makes each unit's reduce-scatter output, the rank's sharded gradients, on its
    # reduce-scatter stream: per iteration, each parameter's first dimension padded to a
    # multiple of the world and divided by it, in float32
    world = 4
    spec = TrainingSpec(model="gpt2", model_args=TINY_GPT2, sample_shape=(64,), batch_size=2,
                        parallel=ParallelSpec(strategy="fsdp", gpus_per_node=world))
    ledger = _prepare(spec, None)._trace(2, real=True).ledger
    made = defaultdict(lambda: defaultdict(int))
    for event in ledger.events:
        if event.delta_bytes > 0:
            made[event.stream][ledger.records[event.record_id].iteration] += event.delta_bytes
    shard = sum(math.ceil(p.shape[0] / world) * math.prod(p.shape[1:])
                for p in ZOO["gpt2"].build(**TINY_GPT2).parameters())
    side = {stream: dict(per) for stream, per in made.items() if stream != 0}
    assert len(side) == 2           # all-gather copy-in and reduce-scatter
    assert {1: 4 * shard, 2: 4 * shard} in side.values()
