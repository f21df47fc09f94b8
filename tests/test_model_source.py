import pytest
import torch

from memcalc.errors import ModelSourceError
from memcalc.model.source import resolve_model


def test_zoo_model_carries_its_defaults():
    source = resolve_model("gpt2")
    assert source.default_shape == (1024,) and source.default_input_dtype == "int64"


def test_user_callable_is_built_on_meta():
    model = resolve_model("tests.fixtures.models:tiny_mlp").build_meta()
    assert {p.device for p in model.parameters()} == {torch.device("meta")}


@pytest.mark.parametrize("reference,message", [
    ("gtp2", r"unknown model 'gtp2' \(did you mean 'gpt2'\?\)"),
    ("tests.fixtures.models:", r"must look like package.module:callable"),
    ("tests.fixtures.models:not_a_module", r"returned int, not a torch.nn.Module"),
])
def test_bad_references(reference, message):
    with pytest.raises(ModelSourceError, match=message):
        resolve_model(reference).build_meta()


def test_builder_argument_errors_name_the_model():
    with pytest.raises(ModelSourceError, match=r"model 'mlp' takes no argument 'width'"):
        resolve_model("mlp", {"width": 3}).build_meta()


def test_a_model_object_is_not_kept_alive_after_the_call():
    import gc
    import weakref

    import memcalc
    from memcalc.pipeline import estimate

    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    alive = weakref.ref(model)
    report = memcalc.estimate(model, (16,), batch_size=2, device="cpu",
                              machine={"cpus": 2, "ram_bytes": 8 << 30})
    del model
    gc.collect()
    assert alive() is None
    # the report's spec names the object, which is gone: a clear error, not another model
    with pytest.raises(ModelSourceError, match="passed to an earlier call"):
        estimate(report.spec)


def test_the_same_object_in_overlapping_calls_stays_until_the_last_one_ends():
    """Two threads with the same model: the one that ends first does not take the object
    from the other ("passed to an earlier call and is not kept")."""
    import threading

    from memcalc.model.source import model_reference

    model = torch.nn.Linear(4, 2)
    second_in, first_out = threading.Event(), threading.Event()
    seen = []

    def second_call():
        with model_reference(model) as name:
            second_in.set()
            first_out.wait()                                  # the first call has ended
            seen.append(resolve_model(name).build_meta())

    with model_reference(model) as name:
        thread = threading.Thread(target=second_call)
        thread.start()
        second_in.wait()
    first_out.set()
    thread.join()
    assert [type(twin) for twin in seen] == [torch.nn.Linear]
    with pytest.raises(ModelSourceError, match="passed to an earlier call"):
        resolve_model(name)                                   # both ended: let go


def test_a_factory_returning_the_callers_model_leaves_its_weights_where_they_are():
    """``memcalc.estimate(lambda: model)``: the model the caller built is copied to meta for
    the trace, never moved (its weights were on meta after the call)."""
    import torch
    from torch import nn

    import memcalc

    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    model.register_buffer("scale", torch.full((4,), 2.0))
    before = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    report = memcalc.estimate(lambda: model, (16,), device="cpu")
    assert report.device.method == "traced"
    assert report.model.parameter_count == sum(p.numel() for p in model.parameters())
    for name, tensor in model.state_dict().items():
        assert tensor.device.type == "cpu" and torch.equal(tensor, before[name]), name


def test_the_meta_twin_shares_the_users_plain_attributes():
    """A numpy table, a logging handler and a lock are shared with the twin: never copied for
    a trace (a 32 MiB array was copied for each) nor pickled (a lock refused the estimate)."""
    import logging
    import threading

    import numpy as np
    from torch import nn

    import memcalc
    from memcalc.model.source import meta_twin

    class WithExtras(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(16, 4)
            self.table = np.zeros(1 << 20, dtype=np.float32)
            self.log = logging.StreamHandler()
            self.lock = threading.Lock()
            self.sizes = [1, 2]

        def forward(self, x):
            return self.layer(x)

    model = WithExtras()
    twin = meta_twin(model)
    assert twin.table is model.table and twin.log is model.log and twin.lock is model.lock
    assert twin.sizes == model.sizes and twin.sizes is not model.sizes
    assert twin.layer.weight.device.type == "meta" and model.layer.weight.device.type == "cpu"
    assert twin._forward_hooks is not model._forward_hooks
    assert memcalc.estimate(model, (16,), device="cpu").device.method == "traced"


def test_a_wrong_model_arg_names_the_accepted_ones():
    from memcalc.errors import ModelSourceError

    with pytest.raises(ModelSourceError, match=r"takes no argument 'layers'; it accepts: "
                                               r"vocab=50257, n_positions=1024, dim=768, "
                                               r"depth=12, heads=12"):
        resolve_model("gpt2", {"layers": 12}).build_meta()


def test_the_zoo_lists_each_builders_arguments_with_their_defaults():
    import inspect

    from memcalc.model.zoo_catalog import zoo_rows
    from models_zoo import ZOO

    for row in zoo_rows():
        names = [argument.split("=")[0] for argument in row.arguments]
        assert names == list(inspect.signature(ZOO[row.name].build).parameters)
