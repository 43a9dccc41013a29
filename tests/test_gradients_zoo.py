"""check_gradients' logic on the buggy model zoo (tests/fixtures/gradient_zoo.py), run in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gradient_support import codes, line_in
from torch_skills.gradients.models import FINDING_CODES, GradientResult
from torch_skills.runner.errors import UserCodeError

REPO_ROOT = Path(__file__).resolve().parents[1]
ZOO_FILE = REPO_ROOT / "tests" / "fixtures" / "gradient_zoo.py"
ZOO = str(ZOO_FILE)


def line_of(text: str) -> int:
    return line_in(ZOO_FILE, text)


def skill_of(result: GradientResult, code: str) -> str | None:
    return next(f.skill for f in result.findings if f.code == code)


# -- healthy ---------------------------------------------------------------------------------------
def test_a_healthy_mlp_has_finite_gradients_and_no_findings(check):
    """Every parameter of a plain MLP gets a finite, non-zero gradient and nothing is flagged."""
    result = check(model=f"{ZOO}:healthy_mlp", input_shape=[8, 16])
    assert result.findings == []
    assert result.nonfinite is None
    assert result.loss is not None and result.loss.finite
    assert len(result.parameters) == 6
    assert all(p.grad_norm and p.grad_norm > 0 and p.flags == [] for p in result.parameters)
    assert result.unused_parameters == [] and result.frozen_parameters == []
    assert result.depth_profile is not None
    assert [layer.module for layer in result.depth_profile.layers] == ["0", "2", "4"]
    assert result.depth_profile.trend == "stable"
    assert "No gradient problems" in result.summary
    assert result.timings.localize_s == 0.0  # no traced rerun on a healthy model


def test_every_finding_code_the_tool_can_emit_is_documented():
    """FINDING_CODES documents each code, and the result schema lists them for clients."""
    description = GradientResult.model_fields["findings"].description or ""
    assert all(code in description for code in FINDING_CODES)


# -- NaN / Inf -------------------------------------------------------------------------------------
def test_a_log_of_zero_is_found_in_the_forward_pass(check):
    """The module whose log turns ReLU zeros into -inf is named, not the layers that pass it on."""
    result = check(model=f"{ZOO}:log_of_zero", input_shape=[8, 16])
    where = result.nonfinite
    assert where is not None
    assert (where.phase, where.module, where.module_type, where.op) == ("forward", "log", "LogLayer", "log")
    assert where.inputs_finite is True and where.kind == "inf"
    assert where.source is not None and where.source.endswith(f"gradient_zoo.py:{line_of('torch.log(x)')}")
    assert codes(result)[0] == "nonfinite_forward"
    assert skill_of(result, "nonfinite_forward") == "debugging-techniques"


def test_a_division_by_a_zero_norm_is_blamed_on_the_division(check):
    """0 / 0 for an all-zero row is traced to the div in the normalize module."""
    result = check(model=f"{ZOO}:zero_norm_division", inputs=f"{ZOO}:inputs_with_zero_rows")
    where = result.nonfinite
    assert where is not None
    assert (where.phase, where.module, where.op, where.kind) == ("forward", "normalize", "div", "nan")
    assert where.inputs_finite is True
    assert "nonfinite_forward" in codes(result)


def test_a_sqrt_at_zero_is_found_in_the_backward_pass(check):
    """A finite forward whose sqrt backward divides by zero names SqrtBackward0 and its module."""
    result = check(model=f"{ZOO}:sqrt_of_zero_backward", inputs=f"{ZOO}:inputs_with_zero_rows")
    assert result.loss is not None and result.loss.finite
    where = result.nonfinite
    assert where is not None
    assert (where.phase, where.autograd_node, where.module) == ("backward", "SqrtBackward0", "normalize")
    assert where.module_type == "SafeLookingNormalize"
    assert where.inputs_finite is True  # the gradient flowing into the node was finite
    assert where.source is not None and "gradient_zoo.py" in where.source
    assert any("nonfinite_grad" in p.flags for p in result.parameters)
    assert codes(result)[0] == "nonfinite_backward"


def test_a_nan_hidden_by_torch_where_is_found_in_backward(check):
    """torch.where drops sqrt's NaN in forward, but backward still multiplies 0 by NaN: the where trap."""
    result = check(model=f"{ZOO}:where_hides_sqrt_of_negative", input_shape=[8, 16])
    where = result.nonfinite
    assert where is not None
    assert (where.phase, where.autograd_node, where.module, where.module_type) == (
        "backward",
        "SqrtBackward0",
        "",
        "WhereSqrt",
    )


def test_nan_in_the_weights_is_reported_before_the_forward_pass(check):
    """A NaN already in a weight is blamed on that parameter, not on the forward pass."""
    result = check(model=f"{ZOO}:nan_in_weights", input_shape=[8, 16])
    where = result.nonfinite
    assert where is not None
    assert (where.phase, where.module, where.op) == ("parameters", "2", "weight")
    assert codes(result) == ["nonfinite_parameters"]
    assert "nonfinite_value" in next(p.flags for p in result.parameters if p.name == "2.weight")


def test_nan_in_the_inputs_is_blamed_on_the_data(check):
    """A NaN in the batch is reported as an input problem."""
    result = check(model=f"{ZOO}:healthy_mlp", inputs=f"{ZOO}:inputs_with_nan")
    assert result.nonfinite is not None and result.nonfinite.phase == "input"
    assert codes(result) == ["nonfinite_input"]


def test_a_naive_bce_loss_is_blamed_on_the_loss_function(check):
    """Finite logits with -log(sigmoid(z)) overflow inside the loss function, which is named."""
    result = check(model=f"{ZOO}:large_logits", input_shape=[8, 16], loss=f"{ZOO}:naive_bce_loss")
    where = result.nonfinite
    assert where is not None
    assert (where.phase, where.module, where.op, where.inputs_finite) == ("loss", None, "log", True)
    assert result.loss is not None and not result.loss.finite and result.loss.value is None
    assert codes(result)[0] == "nonfinite_loss"


def test_an_fp16_overflow_points_to_mixed_precision(check):
    """An Inf created by a float16 Linear adds the fp16_overflow finding for the mixed-precision skill."""
    result = check(model=f"{ZOO}:fp16_overflow", input_shape=[8, 16], input_dtype="float16")
    where = result.nonfinite
    assert where is not None
    assert (where.module, where.op, where.dtype) == ("0", "linear", "float16")
    assert "inf" in where.kind
    assert skill_of(result, "fp16_overflow") == "mixed-precision-and-optimization"


def test_a_nan_the_rerun_cannot_reproduce_is_still_reported(check):
    """When the traced rerun comes out finite, the phase is still reported and flagged as not reproduced."""
    result = check(model=f"{ZOO}:nan_on_first_call_only", input_shape=[8, 16])
    where = result.nonfinite
    assert where is not None
    assert (where.phase, where.located_by, where.module) == ("forward", "not_reproduced", None)
    assert codes(result)[0] == "nonfinite_forward"
    assert "rerun" in result.findings[0].message


# -- parameters without gradients ------------------------------------------------------------------
def test_an_unused_branch_is_reported_as_never_run(check):
    """A head the forward never calls is listed as unused, for the module-design skill."""
    result = check(model=f"{ZOO}:unused_branch", input_shape=[8, 16])
    assert result.unused_parameters == ["aux_head.weight", "aux_head.bias"]
    assert [(b.module, b.cause) for b in result.graph_breaks] == [("aux_head", "never_ran")]
    assert codes(result) == ["unused_parameters"]
    assert skill_of(result, "unused_parameters") == "module-design-patterns"


def test_a_detach_in_the_middle_is_told_apart_from_an_unused_branch(check):
    """Layers that ran but were cut off by .detach() are 'detached', with the line of the detach."""
    result = check(model=f"{ZOO}:detach_in_middle", input_shape=[8, 16])
    assert set(result.unused_parameters) == {
        "encoder.0.weight",
        "encoder.0.bias",
        "encoder.2.weight",
        "encoder.2.bias",
    }
    assert {b.cause for b in result.graph_breaks} == {"detached"}
    detach_line = line_of(".detach()  # the bug")
    assert all(b.source and b.source.endswith(f"gradient_zoo.py:{detach_line}") for b in result.graph_breaks)
    assert codes(result) == ["graph_break_detach"]
    assert "unused_parameters" not in codes(result)


def test_an_encoder_run_under_no_grad_is_reported(check):
    """Modules that ran with autograd off are reported as a no_grad graph break."""
    result = check(model=f"{ZOO}:encoder_under_no_grad", input_shape=[8, 16])
    assert {b.cause for b in result.graph_breaks} == {"no_grad"}
    assert codes(result) == ["graph_break_no_grad"]


def test_frozen_parameters_are_listed_but_only_noted(check):
    """A deliberately frozen layer is listed with an info finding and not counted as unused."""
    result = check(model=f"{ZOO}:frozen_backbone", input_shape=[8, 16])
    assert result.frozen_parameters == ["0.weight", "0.bias"]
    assert result.unused_parameters == []
    assert [(f.severity, f.code) for f in result.findings] == [("info", "frozen_parameters")]


def test_a_model_with_every_parameter_frozen_has_a_loss_without_grad(check):
    """With nothing trainable the loss cannot backpropagate, and the tool says so instead of crashing."""
    result = check(model=f"{ZOO}:everything_frozen", input_shape=[8, 16])
    assert result.loss is not None and result.loss.requires_grad is False
    assert codes(result) == ["loss_not_differentiable"]


# -- gradient scale and dead units -----------------------------------------------------------------
def test_exploding_init_is_flagged(check):
    """Weights with std 1 in a deep ReLU stack give gradient norms far above the threshold."""
    result = check(model=f"{ZOO}:exploding_init", input_shape=[8, 16])
    assert "exploding_gradients" in codes(result)
    assert (
        result.total_grad_norm is not None and result.total_grad_norm > result.thresholds.exploding_grad_norm
    )
    assert any("large_grad" in p.flags for p in result.parameters)


def test_a_deep_sigmoid_stack_has_vanishing_gradients(check):
    """Twenty sigmoid layers shrink the gradient by orders of magnitude from the last layer to the first."""
    result = check(model=f"{ZOO}:vanishing_sigmoid", input_shape=[8, 16])
    profile = result.depth_profile
    assert profile is not None and profile.trend == "vanishing"
    assert profile.first_to_last_ratio is not None and profile.first_to_last_ratio < 1e-3
    assert codes(result) == ["vanishing_gradients"]


def test_dead_relus_are_measured_and_flagged(check):
    """A bias of -10 before a ReLU zeroes every unit: 100% dead, zero gradients upstream."""
    result = check(model=f"{ZOO}:dead_relu", input_shape=[8, 16])
    first = result.activations[0]
    assert (first.module, first.module_type) == ("1", "ReLU")
    assert first.zero_fraction == 1.0 and first.dead_unit_fraction == 1.0
    dead = [f for f in result.findings if f.code == "dead_activations"]
    assert dead[0].severity == "error" and "`1`" in dead[0].message
    assert "zero_gradients" in codes(result)
    assert "zero_grad" in next(p.flags for p in result.parameters if p.name == "0.weight")


def test_a_healthy_relu_is_not_called_dead(check):
    """ReLUs after a default init have some zeros but no unit dead across the batch worth reporting."""
    result = check(model=f"{ZOO}:healthy_mlp", input_shape=[32, 16])
    assert all(a.dead_unit_fraction is not None and a.dead_unit_fraction < 0.5 for a in result.activations)
    assert all(0.2 < a.zero_fraction < 0.8 for a in result.activations)


# -- custom autograd Functions ---------------------------------------------------------------------
def test_a_custom_function_in_the_graph_is_pointed_at_gradcheck(check):
    """A model using a custom Function gets a ready-to-use gradcheck reference for it."""
    result = check(model=f"{ZOO}:model_with_custom_function", input_shape=[8, 16])
    assert result.custom_functions == ["tests/fixtures/gradient_zoo.py:BadSquare"]
    assert skill_of(result, "custom_function_in_graph") == "custom-autograd-functions"


def test_a_missing_factor_in_backward_fails_gradcheck_at_the_largest_input(check):
    """BadSquare returns x*g instead of 2x*g: the worst entry is at the largest |x| (3.0 at [1, 0])."""
    result = check(function=f"{ZOO}:BadSquare", inputs=f"{ZOO}:square_inputs")
    report = result.gradcheck
    assert report is not None and report.function_kind == "autograd.Function"
    assert report.passed is False and "Jacobian mismatch" in report.message
    assert report.worst_output == [0, 1, 0] and report.worst_input == [0, 1, 0]
    assert report.max_abs_error == pytest.approx(3.0, rel=1e-6)
    assert report.worst is not None
    assert report.worst.numerical == pytest.approx(6.0, rel=1e-6)
    assert report.worst.analytical == pytest.approx(3.0, rel=1e-12)
    assert codes(result) == ["gradcheck_failed"]
    assert skill_of(result, "gradcheck_failed") == "custom-autograd-functions"


def test_a_transposed_gradient_is_located_on_the_second_input(check):
    """BadScaledMatmul's wrong gradient for b is reported against input 1, and a's is fine."""
    result = check(function=f"{ZOO}:BadScaledMatmul", inputs=f"{ZOO}:matmul_inputs")
    report = result.gradcheck
    assert report is not None and not report.passed
    assert report.input_shapes == [[3, 4], [4, 3]]
    assert report.worst_input is not None and report.worst_input[0] == 1


def test_correct_functions_pass_gradcheck_and_gradgradcheck(check):
    """A correct autograd.Function and a plain callable both pass, second derivatives included."""
    for target, kind in (("GoodSquare", "autograd.Function"), ("soft_clip", "callable")):
        result = check(function=f"{ZOO}:{target}", input_shape=[3, 4], gradgradcheck=True)
        report = result.gradcheck
        assert report is not None and report.function_kind == kind
        assert report.passed and report.gradgradcheck_passed
        assert report.max_abs_error is not None and report.max_abs_error < report.atol
        assert result.findings == []


def test_a_class_that_is_not_an_autograd_function_is_refused(check):
    """gradcheck mode names what to pass instead of a Module class."""
    with pytest.raises(UserCodeError, match="not a torch.autograd.Function"):
        check(function=f"{ZOO}:LogLayer", input_shape=[3])


def test_gradcheck_on_large_inputs_asks_for_small_shapes(check):
    """Full Jacobians are quadratic, so big inputs are refused with a shape to use instead."""
    with pytest.raises(UserCodeError, match=r"\[3, 4\]"):
        check(function=f"{ZOO}:GoodSquare", input_shape=[64, 64])
