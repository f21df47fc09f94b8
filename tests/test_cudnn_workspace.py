"""Workspace rules: the fit recovers closed-form coefficients; classes and fallbacks."""

import pytest

from memcalc.trace.cudnn_workspace import (
    ConvCall,
    ConvKind,
    ShapeClass,
    UNMEASURED_CEILING,
    WorkspaceModel,
    fit_rules,
    math_mode,
    rule_key,
    shape_class,
)


def _call(kind=ConvKind.FORWARD, batch=2, channels=16, size=16, kernel=3, stride=1, groups=1,
          dtype="float32", tf32=True, transposed=False, dims=3, out_channels=None):
    out_size, out_channels = size // stride, out_channels or channels * 2
    return ConvCall(kind=kind, input_shape=(batch, channels, *[size] * dims),
                    weight_shape=(out_channels, channels // groups, *[kernel] * dims),
                    output_shape=(batch, out_channels, *[out_size] * dims),
                    stride=(stride,) * dims, padding=(kernel // 2,) * dims,
                    dilation=(1,) * dims, groups=groups, transposed=transposed, dtype=dtype,
                    tf32=tf32)


def test_classes_and_math_modes():
    assert shape_class(_call(kernel=1)) is ShapeClass.POINTWISE
    assert shape_class(_call(kernel=1, stride=2)) is ShapeClass.CONV
    assert shape_class(_call(groups=16)) is ShapeClass.DEPTHWISE
    assert shape_class(_call(transposed=True)) is ShapeClass.TRANSPOSED
    assert [math_mode(_call(tf32=True)), math_mode(_call(tf32=False)),
            math_mode(_call(dtype="bfloat16"))] == ["tf32", "fp32", "half"]
    assert rule_key(_call(dims=2))[1] == 2


def test_fit_recovers_a_closed_form_workspace():
    calls = [_call(batch=b, channels=c, size=s, out_channels=o, stride=st) for b in (1, 4)
             for c in (8, 32) for s in (8, 16) for o in (8, 64) for st in (1, 2)]
    samples = [(call, call.input_bytes + call.output_bytes + 2 * call.weight_bytes)
               for call in calls]
    (rule,) = fit_rules(samples)
    assert (rule.input_coef, rule.output_coef, rule.weight_coef) == pytest.approx((1, 1, 2),
                                                                                  abs=1e-3)
    assert rule.calls == len(calls) and rule.error_fraction < 1e-3
    model = WorkspaceModel(rules=[rule])
    unseen = _call(batch=3, channels=24, size=12, out_channels=40)
    expected = unseen.input_bytes + unseen.output_bytes + 2 * unseen.weight_bytes
    assert model.workspace_bytes(unseen) == pytest.approx(expected, rel=1e-3)


def test_coefficients_stay_non_negative_and_the_error_is_stated():
    calls = [_call(batch=b, channels=c, out_channels=o) for b in (1, 2, 4) for c in (8, 16, 32)
             for o in (8, 64)]
    # workspace falls as the output grows for some calls: a free fit would go negative
    samples = [(call, max(0, 3 * call.input_bytes - call.output_bytes)) for call in calls]
    (rule,) = fit_rules(samples)
    assert min(rule.input_coef, rule.output_coef, rule.weight_coef) >= 0
    assert rule.error_fraction > 0 and rule.max_error_bytes > 0


def test_a_class_without_a_rule_borrows_the_nearest_dimensionality_or_needs_none():
    rule, = fit_rules([(_call(dims=3), 1000), (_call(dims=3, channels=8), 500)])
    model = WorkspaceModel(rules=[rule])
    assert model.workspace_bytes(_call(dims=2)) > 0          # 2D borrows the 3D rule
    assert model.workspace_bytes(_call(kind=ConvKind.WGRAD)) == 0   # no rule of that kind


def test_a_plan_search_buffer_is_at_least_the_chosen_workspace():
    plan, = fit_rules([(_call(), 1 << 20), (_call(channels=8), 1 << 19)])
    search, = fit_rules([(_call(), 4 << 20), (_call(channels=8), 2 << 20)])
    model = WorkspaceModel(rules=[plan], find_rules=[search])
    assert model.find_bytes(_call()) >= model.workspace_bytes(_call())
    assert WorkspaceModel(rules=[plan]).find_bytes(_call()) == model.workspace_bytes(_call())


def test_calls_that_do_not_tell_features_apart_keep_the_large_tensors_coefficients():
    # one pointwise layer measured in two dtypes: bytes proportional to the input, and the
    # weights 1,000x smaller than it; the minimum-norm answer gave the weights ~1e5
    small = [_call(kernel=1, channels=32, out_channels=2, size=32, dtype=dtype)
             for dtype in ("bfloat16", "float16")]
    rule, = fit_rules([(call, round(1.3 * call.input_bytes)) for call in small])
    assert rule.weight_coef == 0 and rule.input_coef + rule.output_coef > 0
    wide = _call(kernel=1, channels=512, out_channels=2048, size=8, dtype="bfloat16")
    assert wide.weight_bytes > wide.input_bytes
    assert WorkspaceModel(rules=[rule]).workspace_bytes(wide) <= 1.3 * (
        wide.input_bytes + wide.output_bytes + wide.weight_bytes)


def test_no_prediction_exceeds_the_most_workspace_per_tensor_byte_the_class_took():
    calls = [_call(batch=b, channels=c, out_channels=o) for b in (1, 2) for c in (8, 16)
             for o in (8, 64)]
    measured = [(call, 2 * call.input_bytes + 50 * call.weight_bytes) for call in calls]
    rule, = fit_rules(measured)
    most = max(nbytes / (c.input_bytes + c.output_bytes + c.weight_bytes) for c, nbytes in measured)
    assert rule.ceiling == pytest.approx(most, abs=1e-4) and rule.ceiling >= most
    heavy = _call(batch=1, channels=256, out_channels=256, size=4)   # 50x its weights: capped
    tensors = heavy.input_bytes + heavy.output_bytes + heavy.weight_bytes
    assert rule.predict(heavy) == round(rule.ceiling * tensors) < 50 * heavy.weight_bytes
    # a profile saved before rules had a ceiling gets the stated unmeasured one
    legacy = rule.model_copy(update={"ceiling": None})
    assert legacy.predict(heavy) <= UNMEASURED_CEILING * tensors
