"""A model split into pipeline stages at its repeated blocks, as torchtitan's
``pipeline_module_split`` does: each stage is the model with the blocks of other stages
taken out of their container, the modules before the blocks (embeddings) kept by the first
stage only and those after them (final norm, head) by the last stage only; elsewhere they
become a ``Passthrough`` (an ``nn.Identity``), so the stage's forward passes the hidden state
through.

This holds for models whose forward applies, in order, the modules before the blocks, the
blocks' container, and the modules after it (LLaMA-style decoders, ``nn.Sequential``
stacks); the tracer runs the stages one after the other on the microbatch before tracing and
refuses a split whose last stage does not give the whole model's output.

Stages share the model's submodules (no copy of a parameter is made); parameters registered
directly on a module on the way to the blocks stay in every stage.
"""

from __future__ import annotations

import copy
import itertools
import re

from torch import nn

from memcalc.errors import InputError

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


class Passthrough(nn.Identity):
    """What a module of another stage becomes: its input handed on as it is. While noting
    (``noting``, the run that checks the split), it notes the identity of what it was given
    (``before``: modules ahead of the blocks, which must be given the stage's input;
    ``after``: modules behind them, which must all be given the blocks' output), so that a
    forward doing more than chaining its modules is found and refused. It keeps no
    reference to a tensor."""

    def __init__(self, before: bool) -> None:
        super().__init__()
        self.before = before
        self.noting = False
        self.given: list[int] = []

    def forward(self, value):
        if self.noting:
            self.given.append(id(value))
        return value


def split_points(blocks: int, stages: int) -> list[range]:
    """The blocks of each stage: as even as can be, the earlier stages taking one more."""
    base, extra = divmod(blocks, stages)
    bounds, start = [], 0
    for stage in range(stages):
        end = start + base + (stage < extra)
        bounds.append(range(start, end))
        start = end
    return bounds


def pipeline_stages(model: nn.Module, blocks: list[str], stages: int) -> list[nn.Module]:
    """``model`` split into ``stages`` stage modules at its repeated ``blocks`` (qualified
    names, in order); raises InputError when it cannot be split so."""
    container_path = _container_path(model, blocks)
    if len(blocks) < stages:
        raise InputError(f"pipeline parallelism over {stages} stages needs at least {stages} "
                         f"repeated blocks; the model has {len(blocks)}: use a smaller --pp")
    keys = [name.rsplit(".", 1)[-1] for name in blocks]
    split = [_stage(model, container_path, [keys[i] for i in owned], index, stages)
             for index, owned in enumerate(split_points(len(blocks), stages))]
    _untied(split)
    return split


_IDENTITY_SETTING = re.compile(r"(^|_)(idx|index|id|name)$")
"""A module's setting that names it rather than shapes what it does (a layer's index)."""


def stage_signature(stage: nn.Module) -> tuple:
    """What a stage is made of, module by module in order: its class, its own parameters'
    and buffers' shapes and dtypes, and its plain settings (numbers, strings, flags; not a
    layer's index or name). Two stages alike run the same layers with the same states."""
    return tuple(_module_signature(module) for module in stage.modules())


def _module_signature(module: nn.Module) -> tuple:
    tensors = tuple((name, tuple(tensor.shape), tensor.dtype) for name, tensor in itertools.chain(
        module.named_parameters(recurse=False), module.named_buffers(recurse=False)))
    settings = tuple(sorted((key, value) for key, value in vars(module).items()
                            if not key.startswith("_") and not _IDENTITY_SETTING.search(key)
                            and _plain(value)))
    return type(module), tensors, settings


def _plain(value) -> bool:
    if isinstance(value, tuple):
        return all(_plain(item) for item in value)
    return isinstance(value, (int, float, str, bool, type(None)))


def note_passthroughs(stage: nn.Module) -> None:
    """The next run of ``stage`` is the one ``chains`` checks (its inputs kept alive by the
    caller meanwhile, so that their identities stay theirs)."""
    for module in stage.modules():
        if isinstance(module, Passthrough):
            module.noting, module.given = True, []


def chains(stage: nn.Module, stage_input) -> bool:
    """After ``note_passthroughs`` and a run of ``stage`` on ``stage_input``: its
    passthroughs were each given what a chain of modules gives them (and nothing else).
    They stop noting."""
    passed = [module for module in stage.modules() if isinstance(module, Passthrough)]
    given_before = {given for module in passed if module.before for given in module.given}
    given_after = {given for module in passed if not module.before for given in module.given}
    for module in passed:
        module.noting, module.given = False, []
    return given_before <= {id(stage_input)} and len(given_after) <= 1


def _untied(stages: list[nn.Module]) -> None:
    seen: dict[int, int] = {}
    for index, stage in enumerate(stages):
        for name, parameter in stage.named_parameters():
            if seen.setdefault(id(parameter), index) != index:
                raise InputError(f"parameter {name!r} is tied between pipeline stages "
                                 f"{seen[id(parameter)]} and {index} (a shared embedding and "
                                 "head); untie it for pipelining, as torchtitan does, or use "
                                 "no --pp")


def _container_path(model: nn.Module, blocks: list[str]) -> list[str]:
    parents = {name.rpartition(".")[0] for name in blocks}
    if not blocks or len(parents) != 1 or "" in parents:
        raise InputError("pipeline parallelism splits the model at its repeated blocks, which "
                         "must be the children of one nn.Sequential, nn.ModuleList or "
                         "nn.ModuleDict; this model's are not (give a model built so, or no --pp)")
    path = parents.pop()
    container = model.get_submodule(path)
    if not isinstance(container, _CONTAINERS) or len(container) != len(blocks):
        raise InputError(f"pipeline parallelism splits the model at its repeated blocks; "
                         f"{path!r} holds other modules beside them (give a model whose "
                         "blocks have a container of their own, or no --pp)")
    return path.split(".")


def _stage(model: nn.Module, path: list[str], owned: list[str], index: int,
           stages: int) -> nn.Module:
    first, last = index == 0, index == stages - 1
    root = _shallow(model)
    parent = root
    for depth, step in enumerate(path):
        names = list(parent._modules)
        position = names.index(step)
        for before in names[:position]:
            if not first:
                parent._modules[before] = Passthrough(before=True)
        for after in names[position + 1:]:
            if not last:
                parent._modules[after] = Passthrough(before=False)
        child = parent._modules[step]
        if depth == len(path) - 1:
            parent._modules[step] = _owned_container(child, owned)
        else:
            parent._modules[step] = child = _shallow(child)
        parent = child
    return root


def _shallow(module: nn.Module) -> nn.Module:
    twin = copy.copy(module)
    twin._modules = dict(module._modules)
    return twin


def _owned_container(container: nn.Module, owned: list[str]) -> nn.Module:
    if isinstance(container, nn.ModuleDict):
        return nn.ModuleDict({key: container[key] for key in owned})
    twin = _shallow(container)         # keeps a subclass's own forward
    twin._modules = {str(position): container._modules[key]
                     for position, key in enumerate(owned)}
    return twin
