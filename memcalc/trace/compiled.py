"""Models compiled with ``torch.compile`` (the whole model, blocks one by one as torchtitan
does, or ``Module.compile()`` in place): recognised, and traced as their eager twin. A
compiled step saves other activations for backward (AOTAutograd's partitioner recomputes
cheap ops) and reuses buffers otherwise; that is not modelled yet, and the report says so."""

from __future__ import annotations

from torch import nn

from memcalc.model.build import built_for_real, mark_built_for_real, mark_compiled
from memcalc.model.source import meta_twin
from memcalc.trace._torch_internals import compiled_module_names, without_compile


def eager_model(model: nn.Module, original: nn.Module | None = None) -> nn.Module:
    """``model`` itself when nothing in it (or in the ``original`` it was copied from) is
    compiled; else an eager meta twin (the caller's model untouched), marked with the names
    of the modules that were compiled."""
    names = compiled_module_names(original if original is not None else model)
    if not names:
        return model
    twin = without_compile(meta_twin(model))
    mark_compiled(twin, names)
    if built_for_real(model):
        mark_built_for_real(twin)
    return twin
