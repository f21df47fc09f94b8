"""Which layers tensor parallelism shards, and how: a plan for ``parallelize_module``.

As torchtitan's Llama plan (``parallelize_llama.apply_tp``), by the layers' names: in every
repeated block the projections into attention and into the MLP are column-wise
(``ColwiseParallel``: each rank holds its share of the output features, so of the heads and
of the hidden units), the projections out of them row-wise (``RowwiseParallel``: the partial
sums are all-reduced). The token embedding is row-wise and the output head column-wise with
a replicated output (no ``loss_parallel``). Norms, biases of the row-wise layers and buffers
stay replicated. Adding a naming scheme is one entry in ``COLUMN`` or ``ROW``.

Known limitations: no sequence parallelism (norms and dropout run on the full sequence on
every rank) and no ``loss_parallel`` (every rank holds the full logits).
"""

from __future__ import annotations

from torch import nn

from memcalc.errors import InputError


COLUMN = frozenset({"qkv", "q_proj", "k_proj", "v_proj", "query", "key", "value", "wq", "wk",
                    "wv", "fc", "fc1", "c_fc", "up", "gate", "up_proj", "gate_proj", "w1",
                    "w3", "lin1", "wi", "wi_0", "wi_1"})
"""Last name of a Linear that projects into attention or the MLP (sharded column-wise)."""

ROW = frozenset({"proj", "o_proj", "out_proj", "wo", "down", "down_proj", "w2", "fc2",
                 "c_proj", "lin2"})
"""Last name of a Linear that projects out of attention or the MLP (sharded row-wise)."""


class NoTensorPlan(InputError):
    """The model's blocks have no Linear layers named as the plan knows them."""


def tensor_plan(model: nn.Module, blocks: list[str]) -> dict[str, str]:
    """Qualified layer name → ``colwise``, ``rowwise``, ``embedding-rowwise`` or
    ``head-colwise``, for the repeated ``blocks`` and the layers outside them; NoTensorPlan
    when a block has no column-wise and row-wise pair. Tied weights (an embedding shared
    with the head) stay replicated, so that they stay one tensor."""
    if not blocks:
        raise NoTensorPlan("--tp: the model has no repeated blocks to shard; drop --tp")
    modules = dict(model.named_modules())
    plan: dict[str, str] = {}
    for block in blocks:
        styles = {f"{block}.{name}": _style(name) for name, module
                  in modules[block].named_modules() if isinstance(module, nn.Linear)}
        styles = {name: style for name, style in styles.items() if style}
        if set(styles.values()) != {"colwise", "rowwise"}:
            raise NoTensorPlan(f"--tp: block {block!r} has no Linear layers named as "
                               f"column-wise ({', '.join(sorted(COLUMN)[:6])}…) and row-wise "
                               f"({', '.join(sorted(ROW)[:6])}…) projections; drop --tp")
        plan.update(styles)
    in_blocks = tuple(f"{block}." for block in blocks)
    tied = _tied_weights(model)
    for name, module in modules.items():
        if name.startswith(in_blocks) or name in blocks or id(module) in tied:
            continue
        if isinstance(module, nn.Embedding):
            plan[name] = "embedding-rowwise"
        elif isinstance(module, nn.Linear) and module.out_features > module.in_features:
            plan[name] = "head-colwise"      # the output head (vocabulary or classes)
    return plan


def _style(qualified: str) -> str | None:
    last = qualified.rsplit(".", 1)[-1]
    return "colwise" if last in COLUMN else "rowwise" if last in ROW else None


def _tied_weights(model: nn.Module) -> set[int]:
    """Modules (by id) holding a parameter that another module holds too."""
    holders: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        for parameter in module._parameters.values():
            if parameter is not None:
                holders.setdefault(id(parameter), []).append(module)
    return {id(module) for modules in holders.values() if len(modules) > 1 for module in modules}
