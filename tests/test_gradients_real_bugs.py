"""check_gradients on models written like real ones (tests/fixtures/gradient_real_bugs.py), in-process.

By-design zeros (padded embeddings, LayerDrop) give no warning, a loss fed probabilities gets one,
and a NaN/Inf's fix names the operand that made it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.gradient_support import codes, line_in
from torch_skills.gradients.analysis import depth_profile
from torch_skills.gradients.bydesign import embedding_names
from torch_skills.gradients.causes import operand_cause
from torch_skills.gradients.lossinput import classify
from torch_skills.gradients.models import (
    GradientResult,
    GradientThresholds,
    ParameterGradient,
)
from torch_skills.gradients.probe import ModuleActivity

REPO_ROOT = Path(__file__).resolve().parents[1]
BUGS_FILE = REPO_ROOT / "tests" / "fixtures" / "gradient_real_bugs.py"
BUGS = str(BUGS_FILE)
ZOO = str(REPO_ROOT / "tests" / "fixtures" / "gradient_zoo.py")


def line_of(text: str) -> int:
    return line_in(BUGS_FILE, text)


def message(result: GradientResult, code: str) -> str:
    return next(f.message for f in result.findings if f.code == code)


# -- zero gradients by design ----------------------------------------------------------------------
@pytest.mark.slow  # two 2-layer LSTMs over 40 steps: 1-7 s each on a loaded 2-core machine
@pytest.mark.parametrize("factory", ["seq2seq_with_padding", "seq2seq_sparse_embeddings"])
def test_a_padded_seq2seq_gets_no_vanishing_finding_only_a_note_on_embedding_rows(check, factory):
    """Untouched embedding rows make the embedding's norm tiny; the trend leaves embeddings out and says so."""
    result = check(model=f"{BUGS}:{factory}", inputs=f"{BUGS}:seq2seq_inputs")
    profile = result.depth_profile
    assert profile is not None
    assert profile.excluded == ["src_embed", "tgt_embed"]
    assert profile.trend_with_excluded == "vanishing"  # what the old profile reported
    assert profile.trend == "stable"
    assert [(f.severity, f.code) for f in result.findings] == [("info", "by_design_zeros")]
    rows = {z.module: z for z in result.by_design_zeros}
    assert rows["src_embed"].kind == "unused_embedding_rows"
    assert "padding_idx=0" in rows["src_embed"].detail
    assert "rows got no token" in message(result, "by_design_zeros")
    assert ("sparse" in rows["src_embed"].detail) == (factory == "seq2seq_sparse_embeddings")
    assert "No gradient problems" in result.summary


def test_the_depth_trend_leaves_embeddings_out_and_keeps_what_it_would_have_read():
    """depth_profile: an embedding with a tiny row-sparse norm first no longer makes the trend 'vanishing'."""
    model = nn.Sequential(nn.Embedding(100, 4), nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    norms = {"0": 1e-6, "1": 0.5, "2": 1.0, "3": 2.0}
    params = [
        ParameterGradient(
            name=f"{m}.weight", shape=[4, 4], requires_grad=True, grad_norm=g, param_norm=1.0, ratio=g
        )
        for m, g in norms.items()
    ]
    activity = {m: ModuleActivity(m, type(model[int(m)]).__name__, calls=1, order=int(m)) for m in norms}
    plain = depth_profile(model, params, activity, GradientThresholds())
    aware = depth_profile(model, params, activity, GradientThresholds(), embedding_names(model))
    assert (plain.trend, plain.excluded, plain.trend_with_excluded) == ("vanishing", [], None)
    assert (aware.trend, aware.excluded, aware.trend_with_excluded) == ("stable", ["0"], "vanishing")
    assert aware.first_to_last_ratio == pytest.approx(0.25)


def test_layerdrop_skips_are_an_info_note_not_a_branch_to_remove(check):
    """Layers a LayerDrop loop skipped this step are recognised by rerunning other seeds, and named."""
    result = check(model=f"{BUGS}:layerdrop_encoder", input_shape=[2, 10, 32], seed=3)
    assert result.graph_breaks, "seed 3 must skip at least one layer for this test to mean anything"
    assert {b.cause for b in result.graph_breaks} == {"stochastic_skip"}
    assert [(f.severity, f.code) for f in result.findings] == [("info", "by_design_zeros")]
    skipped = [z for z in result.by_design_zeros if z.kind == "stochastic_skip"]
    assert skipped and all(z.module.startswith("layers.") and z.module.count(".") == 1 for z in skipped)
    assert all(z.module_type == "TransformerEncoderLayer" for z in skipped)
    assert sum(len(z.parameters) for z in skipped) == len(result.unused_parameters)
    assert "find_unused_parameters=True" in message(result, "by_design_zeros")
    assert "by design" in result.summary


def test_a_stochastic_depth_branch_dropped_this_step_is_by_design(check):
    """A residual branch multiplied by a random 0 gets an all-zero gradient; another seed gives it one."""
    result = check(model=f"{BUGS}:stochastic_depth_mlp", input_shape=[8, 16], seed=3)
    dropped = [p.name for p in result.parameters if "stochastic_zero_grad" in p.flags]
    assert dropped == ["2.fc.weight", "2.fc.bias"]
    assert [(f.severity, f.code) for f in result.findings] == [("info", "by_design_zeros")]
    assert [(z.module, z.kind) for z in result.by_design_zeros] == [("2.fc", "stochastic_skip")]


def test_a_constant_zero_multiplier_is_still_a_zero_gradients_warning(check):
    """The reseeded reruns do not excuse a branch multiplied by a constant 0."""
    result = check(model=f"{ZOO}:zero_multiplier", input_shape=[8, 16])
    assert "zero_gradients" in codes(result)
    assert result.by_design_zeros == []


def test_a_branch_no_seed_takes_is_still_an_unused_parameters_warning(check):
    """The reseeded reruns do not excuse a module that never runs (a disabled auxiliary head)."""
    result = check(model=f"{ZOO}:unused_branch", input_shape=[8, 16])
    assert [(b.module, b.cause) for b in result.graph_breaks] == [("aux_head", "never_ran")]
    assert codes(result) == ["unused_parameters"]
    assert result.by_design_zeros == []


# -- a loss fed probabilities where it expects logits ----------------------------------------------
@pytest.mark.parametrize(
    ("factory", "loss", "problem", "chain"),
    [
        (
            "classifier_with_softmax",
            "cross_entropy_loss",
            "double_softmax",
            ["LogSoftmaxBackward0", "SoftmaxBackward0"],
        ),
        (
            "classifier_with_softmax",
            "nll_on_log_of_softmax",
            "double_softmax",
            ["LogBackward0", "SoftmaxBackward0", "SoftmaxBackward0"],
        ),
        ("healthy_mlp", "nll_on_softmax", "probabilities_into_nll", ["SoftmaxBackward0"]),
        (
            "classifier_with_sigmoid",
            "bce_with_logits_loss",
            "probabilities_into_bce_with_logits",
            ["SigmoidBackward0"],
        ),
    ],
)
def test_a_loss_fed_probabilities_is_found_from_the_graph(check, factory, loss, problem, chain):
    """The softmax/sigmoid feeding a logits loss is read from grad_fn names; the fix says pass logits."""
    model = f"{ZOO}:{factory}" if factory == "healthy_mlp" else f"{BUGS}:{factory}"
    result = check(model=model, input_shape=[8, 16], loss=f"{BUGS}:{loss}")
    assert [(i.problem, i.chain) for i in result.loss_inputs] == [(problem, chain)]
    assert codes(result) == ["loss_on_probabilities"]
    assert result.findings[0].severity == "warning"
    assert "pass the logits" in message(result, "loss_on_probabilities")


@pytest.mark.parametrize("loss", ["cross_entropy_on_log_softmax", "cross_entropy_on_log_of_softmax"])
def test_log_softmax_applied_twice_is_an_info_note_because_it_is_idempotent(check, loss):
    """cross_entropy on log-probabilities changes neither loss nor gradient: info, not a warning."""
    result = check(model=f"{ZOO}:healthy_mlp", input_shape=[8, 16], loss=f"{BUGS}:{loss}")
    plain = check(model=f"{ZOO}:healthy_mlp", input_shape=[8, 16], loss=f"{BUGS}:cross_entropy_loss")
    assert [i.problem for i in result.loss_inputs] == ["log_softmax_twice"]
    assert [(f.severity, f.code) for f in result.findings] == [("info", "redundant_log_softmax")]
    assert result.total_grad_norm == pytest.approx(plain.total_grad_norm, rel=1e-5)


@pytest.mark.parametrize("loss", ["cross_entropy_loss", "bce_with_logits_loss"])
def test_a_logits_loss_on_logits_gets_no_finding(check, loss):
    """The healthy control: CrossEntropyLoss and BCEWithLogitsLoss on raw logits."""
    result = check(model=f"{ZOO}:healthy_mlp", input_shape=[8, 16], loss=f"{BUGS}:{loss}")
    assert result.loss_inputs == [] and result.findings == []


def test_the_loss_input_rules_cover_log_of_softmax_and_plain_losses():
    """classify: log(softmax) counts as log_softmax; nothing in front of the loss is no problem."""
    assert classify("NllLossBackward0", []) is None
    assert classify("NllLossBackward0", ["log_softmax"]) is None
    assert classify("NllLossBackward0", ["log_softmax", "sigmoid"]) == "double_softmax"
    assert classify("NllLoss2DBackward0", ["softmax"]) == "probabilities_into_nll"
    assert (
        classify("BinaryCrossEntropyWithLogitsBackward0", ["softmax"]) == "probabilities_into_bce_with_logits"
    )
    assert classify("BinaryCrossEntropyWithLogitsBackward0", ["log_sigmoid"]) is None


# -- NaN/Inf fixes that name the operand -----------------------------------------------------------
def test_a_masked_mean_names_the_zero_divisor_and_how_many_rows(check):
    """0/0 in a masked mean: the divisor is named with the count of rows whose mask is empty."""
    result = check(model=f"{BUGS}:masked_mean_pool", inputs=f"{BUGS}:masked_inputs")
    where = result.nonfinite
    assert where is not None and (where.phase, where.op, where.kind) == ("forward", "div", "nan")
    assert where.source is not None and where.source.endswith(f":{line_of('/ mask.sum(dim=1')}")
    assert where.cause is not None
    assert "divisor" in where.cause and "is 0 in 3 of 8 rows" in where.cause
    assert "numerator is 0 too" in where.cause
    text = message(result, "nonfinite_forward")
    assert where.cause in text and "clamp" in text


def test_sqrt_of_a_negative_counts_the_negative_entries(check):
    """sqrt of a Linear's output: the cause counts the negative entries and gives the minimum."""
    result = check(model=f"{BUGS}:sqrt_of_negative", input_shape=[8, 16])
    where = result.nonfinite
    assert where is not None and where.op == "sqrt"
    assert where.cause is not None and "negative at" in where.cause and "min -" in where.cause
    assert "clamp_min(0)" in message(result, "nonfinite_forward")


def test_log_of_zero_counts_the_zeros(check):
    """log after a ReLU: the cause counts the exact zeros (log gives -inf)."""
    result = check(model=f"{ZOO}:log_of_zero", input_shape=[8, 16])
    where = result.nonfinite
    assert where is not None and where.cause is not None
    assert "is 0 at" in where.cause and "-inf" in where.cause


def test_an_infeasible_ctc_target_names_the_samples_and_their_lengths(check):
    """CTCLoss is inf for targets longer than the input: samples, lengths, and zero_infinity vs fixing lengths."""
    result = check(
        model=f"{BUGS}:ctc_model", inputs=f"{BUGS}:audio_inputs", loss=f"{BUGS}:ctc_loss_with_long_targets"
    )
    where = result.nonfinite
    assert where is not None and (where.phase, where.op, where.kind) == ("loss", "ctc_loss", "inf")
    assert where.cause is not None and where.cause.startswith("2 of 4 samples")
    assert "sample 1: input length 16 < target length 20" in where.cause
    assert "sample 3: input length 16 < target length 18" in where.cause
    text = message(result, "nonfinite_loss")
    assert "zero_infinity=True" in text and "input_lengths" in text


def test_a_sqrt_at_zero_in_backward_counts_the_zero_outputs(check):
    """SqrtBackward0's saved output is read: the zeros where 1/(2*sqrt(x)) is infinite are counted."""
    result = check(model=f"{ZOO}:sqrt_of_zero_backward", inputs=f"{ZOO}:inputs_with_zero_rows")
    where = result.nonfinite
    assert where is not None and where.autograd_node == "SqrtBackward0"
    assert where.cause is not None and "sqrt's output is 0 at 2 of 8" in where.cause


def test_ctc_feasibility_counts_the_blank_a_repeated_label_needs():
    """Target [1, 1, 2] needs 4 frames (a blank between the repeated 1s): 3 frames are infeasible."""
    log_probs = torch.randn(3, 1, 5).log_softmax(-1)
    cause, fix = operand_cause("ctc_loss", (log_probs, torch.tensor([[1, 1, 2]]), [3], [3]), {})
    assert cause is not None and "input length 3 < target length 3 + 1 repeats" in cause
    assert fix is not None
    assert operand_cause("ctc_loss", (log_probs, torch.tensor([[1, 2, 3]]), [3], [3]), {}) == (None, None)


def test_a_division_by_the_python_number_zero_is_named():
    """x / 0 with a plain number: the cause says the divisor is the number 0."""
    cause, _ = operand_cause("div", (torch.ones(2), 0), {})
    assert cause == "the divisor is the Python number 0"


# -- a Hugging Face model ---------------------------------------------------------------------------
@pytest.mark.slow  # importing transformers and two traced steps: 10-60 s on a loaded machine
def test_wav2vec2_layerdrop_is_by_design_and_its_infeasible_ctc_names_the_lengths(check):
    """transformers' Wav2Vec2ForCTC: its LayerDrop is an info note; too-long labels name lengths and the fix."""
    pytest.importorskip("transformers")
    healthy = check(model=f"{BUGS}:wav2vec2_ctc", inputs=f"{BUGS}:wav2vec2_inputs")
    assert healthy.graph_breaks and {b.cause for b in healthy.graph_breaks} == {"stochastic_skip"}
    assert [(f.severity, f.code) for f in healthy.findings] == [("info", "by_design_zeros")]
    assert all(z.module_type == "Wav2Vec2EncoderLayer" for z in healthy.by_design_zeros)
    broken = check(model=f"{BUGS}:wav2vec2_ctc", inputs=f"{BUGS}:wav2vec2_too_long_labels")
    where = broken.nonfinite
    assert where is not None and (where.op, where.kind) == ("ctc_loss", "inf")
    assert where.cause is not None and "sample 0: input length 159 < target length 200" in where.cause
    assert "ctc_zero_infinity" in (where.fix or "")


def test_a_rerun_that_raises_leaves_the_unused_parameters_warning(check):
    """A model that fails on its second call: the reseeded rerun decides nothing and the warning stands."""
    result = check(model=f"{BUGS}:fails_after_first_call", input_shape=[8, 16])
    assert [(b.module, b.cause) for b in result.graph_breaks] == [("aux", "never_ran")]
    assert codes(result) == ["unused_parameters"]
