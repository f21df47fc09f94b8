"""cuDNN convolution calls and the workspace each one allocates through the caching allocator.

A ``ConvCall`` names one cuDNN call of a training step (forward, data gradient or weight
gradient) by its shapes, dtype and math mode; ``MeasuredConv`` is what a real GPU held
during it.
"""

from __future__ import annotations

from enum import Enum
from math import ceil, prod

from pydantic import BaseModel, ConfigDict

from memcalc.dtypes import dtype_bytes

class ConvKind(str, Enum):
    """The three cuDNN calls of a convolution in training."""

    FORWARD = "fwd"
    DGRAD = "dgrad"
    WGRAD = "wgrad"


class ConvCall(BaseModel):
    """One cuDNN call: ``input`` is x, ``output`` is y (the forward's), for every kind."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ConvKind
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    transposed: bool
    dtype: str
    channels_last: bool = False
    tf32: bool = True
    """``torch.backends.cudnn.allow_tf32`` (True by default)."""
    benchmark: bool = False
    """``torch.backends.cudnn.benchmark`` (False by default)."""

    @property
    def spatial_dims(self) -> int:
        return len(self.input_shape) - 2

    @property
    def element_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def input_bytes(self) -> int:
        return prod(self.input_shape) * self.element_bytes

    @property
    def output_bytes(self) -> int:
        return prod(self.output_shape) * self.element_bytes

    @property
    def weight_bytes(self) -> int:
        return prod(self.weight_shape) * self.element_bytes

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.input_shape[1]


class MeasuredConv(BaseModel):
    """What one call held on a real GPU beyond its inputs and outputs (allocator block bytes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    call: ConvCall
    backend: str
    """ATen's conv backend (``Cudnn``, ``CudaDepthwise2d``, ...)."""
    iteration: int
    first_call: bool
    """First call with this signature in the process (cuDNN picks and caches its plan)."""
    transient_peak_bytes: int
    transient_total_bytes: int
    transient_blocks: int
    reserved_growth_bytes: int
    alloc_retries: int = 0


class ShapeClass(str, Enum):
    """Convolution families whose cuDNN engines need workspace differently."""

    CONV = "conv"
    POINTWISE = "pointwise"
    """1×1 kernel, stride 1: a plain matrix product, usually no workspace."""
    DEPTHWISE = "depthwise"
    TRANSPOSED = "transposed"


def math_mode(call: ConvCall) -> str:
    """``fp32`` (TF32 off), ``tf32`` (fp32 with cuDNN's TF32, the default) or ``half``."""
    if call.dtype == "float32":
        return "tf32" if call.tf32 else "fp32"
    return "half"


def shape_class(call: ConvCall) -> ShapeClass:
    if call.transposed:
        return ShapeClass.TRANSPOSED
    if call.depthwise:
        return ShapeClass.DEPTHWISE
    if all(size == 1 for size in call.weight_shape[2:]) and all(s == 1 for s in call.stride):
        return ShapeClass.POINTWISE
    return ShapeClass.CONV


RuleKey = tuple[ConvKind, int, str, ShapeClass]


def rule_key(call: ConvCall) -> RuleKey:
    return (call.kind, min(call.spatial_dims, 3), math_mode(call), shape_class(call))


UNMEASURED_CEILING = 12.0
"""Workspace per byte of a call's tensors for a rule that states no ceiling of its own (a
profile saved before rules had one): the most any call took on the H100 profile's data
(a 2D fp32 forward, ``benchmarks/gpu_data/h100-convs.json.gz``)."""


class WorkspaceRule(BaseModel):
    """``bytes = input_coef·x + output_coef·y + weight_coef·w`` (tensor bytes) for one class
    of calls, fitted by non-negative least squares, with the fit's error on its data, and
    never above ``ceiling`` times the call's tensor bytes ``x + y + w``.

    The ceiling is the most workspace per tensor byte any fitted call of the class took: a
    linear fit of few calls can put a large coefficient on a small feature (a 3D 1×1×1
    class fitted to two calls of 64 KiB weights put 114,687 on the weight bytes, which on
    ResNet-50's 2 MiB weights predicted 224 GiB), and cuDNN's heuristics choose plans whose
    workspace scales with the tensors they read, not past them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ConvKind
    spatial_dims: int
    math: str
    shape: ShapeClass
    input_coef: float
    output_coef: float
    weight_coef: float
    calls: int
    """Distinct measured calls the rule was fitted to."""
    error_fraction: float
    """Sum of absolute errors over the sum of measured bytes, on the fitted calls."""
    max_error_bytes: int
    ceiling: float | None = None
    """The most workspace bytes per tensor byte (``x + y + w``) a fitted call took; None in
    profiles saved before rules had one (``UNMEASURED_CEILING`` then)."""

    @property
    def key(self) -> RuleKey:
        return (self.kind, self.spatial_dims, self.math, self.shape)

    def predict(self, call: ConvCall) -> int:
        linear = (self.input_coef * call.input_bytes + self.output_coef * call.output_bytes
                  + self.weight_coef * call.weight_bytes)
        ceiling = UNMEASURED_CEILING if self.ceiling is None else self.ceiling
        return max(0, round(min(linear, ceiling * _tensor_bytes(call))))


def _tensor_bytes(call: ConvCall) -> int:
    return call.input_bytes + call.output_bytes + call.weight_bytes


class WorkspaceModel(BaseModel):
    """Rules for the workspace a call's chosen plan allocates (``rules``) and, with
    ``cudnn.benchmark``, the buffer the first call of a signature times plans in
    (``find_rules``). A class without a rule borrows the nearest one (same kind and math)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rules: list[WorkspaceRule]
    find_rules: list[WorkspaceRule] = []

    def workspace_bytes(self, call: ConvCall) -> int:
        rule = _nearest(self.rules, rule_key(call))
        return rule.predict(call) if rule else 0

    def find_bytes(self, call: ConvCall) -> int:
        rule = _nearest(self.find_rules, rule_key(call))
        return max(rule.predict(call) if rule else 0, self.workspace_bytes(call))

    def error_summary(self) -> tuple[float, int]:
        """Weighted fit error over all rules, and the calls they were fitted to."""
        calls = sum(rule.calls for rule in self.rules)
        if not calls:
            return 0.0, 0
        return sum(rule.error_fraction * rule.calls for rule in self.rules) / calls, calls


def _nearest(rules: list[WorkspaceRule], key: RuleKey) -> WorkspaceRule | None:
    exact = [rule for rule in rules if rule.key == key]
    if exact:
        return exact[0]
    kind, dims, math, shape = key
    similar = [rule for rule in rules if rule.kind == kind and rule.shape == shape
               and rule.math == math]
    return min(similar, key=lambda rule: abs(rule.spatial_dims - dims)) if similar else None


def fit_rules(samples: list[tuple[ConvCall, int]]) -> list[WorkspaceRule]:
    """One rule per class of the measured ``(call, bytes)`` samples (distinct calls; the
    largest bytes seen for a call are kept)."""
    largest: dict[ConvCall, int] = {}
    for call, nbytes in samples:
        largest[call] = max(largest.get(call, 0), nbytes)
    classes: dict[RuleKey, list[tuple[ConvCall, int]]] = {}
    for call, nbytes in largest.items():
        classes.setdefault(rule_key(call), []).append((call, nbytes))
    return [_fit_class(key, items) for key, items in sorted(classes.items(), key=str)]


def _fit_class(key: RuleKey, items: list[tuple[ConvCall, int]]) -> WorkspaceRule:
    features = [(call.input_bytes, call.output_bytes, call.weight_bytes) for call, _ in items]
    measured = [nbytes for _, nbytes in items]
    coefficients = _nonnegative_least_squares(features, measured)
    predicted = [sum(c * f for c, f in zip(coefficients, row)) for row in features]
    errors = [abs(p - m) for p, m in zip(predicted, measured)]
    kind, dims, math, shape = key
    return WorkspaceRule(kind=kind, spatial_dims=dims, math=math, shape=shape,
                         input_coef=round(coefficients[0], 4) + 0.0,
                         output_coef=round(coefficients[1], 4) + 0.0,
                         weight_coef=round(coefficients[2], 4) + 0.0, calls=len(items),
                         error_fraction=round(sum(errors) / max(1, sum(measured)), 4),
                         max_error_bytes=round(max(errors)),
                         ceiling=ceil(max(nbytes / max(1, _tensor_bytes(call))
                                          for call, nbytes in items) * 1e4) / 1e4)


def _nonnegative_least_squares(rows: list[tuple[int, ...]], targets: list[int]) -> list[float]:
    """Least squares with coefficients ≥ 0: drop the most negative one and solve again.

    Features the calls cannot tell apart (fewer independent calls than features, e.g. one
    layer measured in two dtypes) are dropped smallest tensor first until the rest are
    independent: the minimum-norm answer would otherwise spread the workspace evenly over
    the scaled features and give the smallest tensor the largest coefficient."""
    import torch

    active = list(range(len(rows[0])))
    matrix = torch.tensor(rows, dtype=torch.float64)
    # Columns scaled to unit norm and solved by SVD with a cutoff: input and output bytes are
    # nearly proportional in some classes, and the minimum-norm answer is then the stable one.
    scale = matrix.norm(dim=0).clamp(min=1.0)
    matrix = matrix / scale
    vector = torch.tensor(targets, dtype=torch.float64).unsqueeze(1)
    solution = torch.zeros(0, dtype=torch.float64)
    while len(active) > 1 and _rank(matrix[:, active]) < len(active):
        active.remove(min(active, key=lambda index: float(scale[index])))
    while active:
        solution = torch.linalg.lstsq(matrix[:, active], vector, rcond=1e-6,
                                      driver="gelsd").solution.squeeze(1)
        if bool((solution >= -1e-9 * solution.abs().max()).all()):
            break
        active.pop(int(torch.argmin(solution)))
    coefficients = [0.0] * len(rows[0])
    for index, value in zip(active, solution.tolist()):
        coefficients[index] = max(0.0, value) / float(scale[index])
    return coefficients


def _rank(matrix) -> int:
    import torch

    singular = torch.linalg.svdvals(matrix)
    return int((singular > 1e-6 * singular.max()).sum()) if singular.numel() else 0
