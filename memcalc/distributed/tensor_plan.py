"""Which layers tensor parallelism shards, and how: a plan for ``parallelize_module``.

As torchtitan's Llama plan (``parallelize_llama.apply_tp``), by the layers' names: in every
repeated block the projections into attention and into the MLP are column-wise
(``ColwiseParallel``: each rank holds its share of the output features, so of the heads and
of the hidden units), the projections out of them row-wise (``RowwiseParallel``: the partial
sums are all-reduced). The token embedding is row-wise and the output head column-wise with
a replicated output. Norms, biases of the row-wise layers and buffers stay replicated.
Adding a naming scheme is one entry in ``COLUMN`` or ``ROW``.

``tensor_layout`` adds what torchtitan's jobs run with it, where the model's layout allows:
sequence parallelism (the residual stream between the projections sharded on the sequence:
the norms ``SequenceParallel``, each projection container's input gathered by
``PrepareModuleInput``, the row-wise outputs reduce-scattered to ``Shard(1)``, the embedding's
output ``Shard(1)``) and ``loss_parallel`` (the head's logits stay sharded on the vocabulary
and the cross-entropy runs on the shards).

Known limitations: sequence parallelism is applied by the layout's shape (an untied token
embedding and head outside the blocks, no other embedding, every projection pair inside a
container of its block), not by reading ``forward``: a block that mixes positions outside
its containers would need its own plan.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class TensorLayout:
    """Layer name → style for ``parallelize_module`` (``tensor_plan``'s, and with sequence
    parallelism ``sequence`` norms, ``gather-input`` containers, ``rowwise-sequence``,
    ``embedding-sequence``; the head ``head-sequence`` / ``head-loss-parallel`` /
    ``head-sequence-loss-parallel``), and why sequence or loss parallelism was not applied
    where asked ("" when applied or not asked)."""

    styles: dict[str, str]
    sequence_parallel: bool
    loss_parallel: bool
    not_sequence_parallel: str = ""
    not_loss_parallel: str = ""

    def describe(self) -> str:
        """``sequence parallel, loss parallel`` or why not, in a few words."""
        parts = ["sequence parallel" if self.sequence_parallel else
                 f"no sequence parallel ({self.not_sequence_parallel})"
                 if self.not_sequence_parallel else "",
                 "loss parallel" if self.loss_parallel else
                 f"no loss parallel ({self.not_loss_parallel})" if self.not_loss_parallel
                 else ""]
        return ", ".join(part for part in parts if part)


def tensor_layout(model: nn.Module, blocks: list[str], sequence_parallel: bool,
                  loss_parallel: bool) -> TensorLayout:
    """``tensor_plan`` with torchtitan's sequence parallelism and ``loss_parallel`` where asked
    and the model's layout allows them (``loss_parallel``: the caller asks only for a
    cross-entropy loss); NoTensorPlan as ``tensor_plan``."""
    styles = tensor_plan(model, blocks)
    head = next((name for name, style in styles.items() if style == "head-colwise"), None)
    not_sequence = _not_sequence_parallel(model, blocks, styles, head) if sequence_parallel else ""
    sequence = sequence_parallel and not not_sequence
    not_loss = ("" if not loss_parallel else
                "the output head is tied to the embedding or absent" if head is None else "")
    loss = loss_parallel and not not_loss
    if sequence:
        modules = dict(model.named_modules())
        for block in blocks:
            for name, module in modules[block].named_modules():
                if name and _is_norm(module):
                    styles[f"{block}.{name}"] = "sequence"
            for name in _containers(block, styles):
                styles[name] = "gather-input"
        for name, module in modules.items():
            if _is_norm(module) and not name.startswith(tuple(f"{b}." for b in blocks)):
                styles[name] = "sequence"
        for name, style in list(styles.items()):
            styles[name] = {"rowwise": "rowwise-sequence",
                            "embedding-rowwise": "embedding-sequence"}.get(style, style)
    if head is not None and (sequence or loss):
        styles[head] = ("head-sequence-loss-parallel" if sequence and loss else
                        "head-sequence" if sequence else "head-loss-parallel")
    return TensorLayout(styles, sequence, loss, not_sequence, not_loss)


def _not_sequence_parallel(model: nn.Module, blocks: list[str], styles: dict[str, str],
                           head: str | None) -> str:
    """Why the residual stream cannot be sharded on the sequence ("" when it can)."""
    embeddings = [name for name, style in styles.items() if style == "embedding-rowwise"]
    others = [name for name, module in model.named_modules()
              if isinstance(module, nn.Embedding) and name not in embeddings]
    if head is None or len(embeddings) != 1:
        return "the embedding or the head is tied, shared or absent"
    if others:
        return f"another embedding ({others[0]}) is added to the token embedding"
    for block in blocks:
        if any(_parent(name) == block for name, style in styles.items()
               if name.startswith(f"{block}.") and style in ("colwise", "rowwise")):
            return f"block {block!r} holds its projections directly, not in containers"
        containers = _containers(block, styles)
        rows = {_parent(name) for name, style in styles.items()
                if name.startswith(f"{block}.") and style == "rowwise"}
        if rows != set(containers):
            return f"a container of block {block!r} has no row-wise projection out of it"
    return ""


def _containers(block: str, styles: dict[str, str]) -> list[str]:
    """The modules of ``block`` that hold its column-wise projections."""
    return sorted({_parent(name) for name, style in styles.items()
                   if name.startswith(f"{block}.") and style == "colwise"})


def _parent(qualified: str) -> str:
    return qualified.rsplit(".", 1)[0]


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or type(module).__name__.endswith(
        ("RMSNorm", "LayerNorm"))
