"""The zoo as report rows: parameter counts measured on ``meta`` builds."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict

from memcalc.model.builder_arguments import builder_arguments
from models_zoo import ZOO


class ZooRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    parameter_count: int
    default_shape: tuple[int, ...]
    input_dtype: str
    description: str
    arguments: list[str] = []
    """What ``--model-arg`` may set: ``name=default``."""


def zoo_rows() -> list[ZooRow]:
    rows = []
    for entry in ZOO.values():
        with torch.device("meta"):
            model = entry.build()
        rows.append(ZooRow(name=entry.name,
                           parameter_count=sum(p.numel() for p in model.parameters()),
                           default_shape=entry.default_shape, input_dtype=entry.input_dtype,
                           description=entry.description,
                           arguments=builder_arguments(entry.build)))
    return rows
