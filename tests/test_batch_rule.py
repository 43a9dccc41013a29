"""One batch rule for every tool: tensors, (inputs, target) pairs, dicts, and the model's own loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.fixtures import batch_models as bm
from torch_skills.checkpoint.models import VerifyCheckpointRequest
from torch_skills.checkpoint.worker import run as verify_run
from torch_skills.gradients.models import GradientRequest
from torch_skills.gradients.worker import run as gradients_run
from torch_skills.memory.models import EstimateMemoryRequest
from torch_skills.memory.worker import run as memory_run
from torch_skills.profiling.models import ProfileRequest
from torch_skills.profiling.worker import run as profile_run
from torch_skills.runner.child import JobContext
from torch_skills.runner.usercode import rule_loss, split_batch

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "tests" / "fixtures" / "batch_models.py"


@pytest.fixture
def job(tmp_path: Path) -> JobContext:
    return JobContext(tmp_path, "cpu", [str(REPO), str(tmp_path)], str(REPO))


def test_a_pair_for_a_one_argument_forward_is_inputs_and_target():
    """(x, y) with forward(x): the model gets x, y becomes the target."""
    split = split_batch(bm.classifier(), bm.pair_batch())
    assert split.kind == "inputs_target" and len(split.args) == 1 and split.target.dtype == torch.int64


def test_a_pair_the_forward_takes_whole_is_fed_whole():
    """forward(x, mask) and forward(idx, targets=None) take both elements: nothing is held back."""
    assert split_batch(bm.two_inputs(), bm.masked_batch()).kind == "positional"
    assert split_batch(bm.own_loss_lm(), bm.token_pair()).kind == "positional"


def test_tensors_and_dicts_follow_training_code():
    """A tensor is model(x), a dict model(**batch)."""
    assert split_batch(bm.classifier(), torch.ones(2, bm.FEATURES)).call == "model(batch)"
    assert split_batch(bm.labelled_model(), bm.dict_batch()).call == "model(**batch)"


def test_integer_targets_get_cross_entropy_and_float_targets_mse():
    """The default loss uses the target: class targets on dim 1 or the last dim, regression targets."""
    logits, y = torch.randn(8, 5), torch.randint(0, 5, (8,))
    loss, how = rule_loss(logits, y)
    assert how.startswith("cross_entropy") and torch.allclose(
        loss, torch.nn.functional.cross_entropy(logits, y)
    )
    lm_logits, tokens = torch.randn(2, 7, 11), torch.randint(0, 11, (2, 7))
    loss, how = rule_loss(lm_logits, tokens)
    expected = torch.nn.functional.cross_entropy(lm_logits.reshape(-1, 11), tokens.reshape(-1))
    assert "last dim" in how and torch.allclose(loss, expected)
    loss, how = rule_loss(torch.randn(8, 1), torch.randn(8))
    assert how == "mse_loss(output.squeeze(-1), target)"


def test_the_models_own_loss_wins_and_its_absence_is_explained():
    """output.loss is the loss; a None loss says to put labels in the batch; nanoGPT's scalar is found."""
    model = bm.labelled_model()
    out = model(**bm.dict_batch())
    loss, how = rule_loss(out)
    assert loss is not None and torch.equal(loss, out.loss) and how.startswith("output.loss")
    _, how = rule_loss(model(**bm.dict_batch_without_labels()))
    assert "output.loss is None" in how
    logits, own = bm.own_loss_lm()(*bm.token_pair())
    loss, how = rule_loss((logits, own))
    assert torch.equal(loss, own) and how.startswith("output[1]")


def test_a_target_that_fits_no_rule_falls_back_to_the_mean_and_says_so():
    """A target whose shape matches neither rule: the mean, with a note to pass loss=."""
    _, how = rule_loss(torch.randn(8, 5), torch.randn(3))
    assert how.startswith("mean of the output") and "loss='file.py:loss_fn'" in how


@pytest.mark.parametrize(
    ("model", "inputs", "kind", "loss_start"),
    [
        ("classifier", "pair_batch", "inputs_target", "cross_entropy"),
        ("regressor", "regression_pair", "inputs_target", "mse_loss"),
        ("labelled_model", "dict_batch", "dict", "output.loss"),
        ("own_loss_lm", "token_pair", "positional", "output[1]"),
    ],
)
def test_every_tool_applies_the_same_rule_and_reports_it(job, model, inputs, kind, loss_start):
    """check_gradients, estimate_memory and profile_model feed the batch alike and say which rule they used."""
    common = {"model": f"{MODELS}:{model}", "inputs": f"{MODELS}:{inputs}", "device": "cpu"}
    grads = gradients_run(GradientRequest(**common), job)
    assert grads.batch_rule.batch == kind and grads.batch_rule.loss.startswith(loss_start)
    assert grads.findings == [] or all(f.severity == "info" for f in grads.findings), grads.findings
    memory = memory_run(EstimateMemoryRequest(**common), job)
    assert memory.batch_rule.batch == kind and memory.batch_rule.loss.startswith(loss_start)
    profile = profile_run(ProfileRequest(**common, warmup_steps=1, active_steps=3), job)
    assert profile.batch_rule.batch == kind and profile.batch_rule.loss.startswith(loss_start)


def test_verify_checkpoint_runs_the_forward_on_a_pair_batch(job, tmp_path: Path):
    """A checkpoint's test forward feeds (x, y) batches by the same rule."""
    path = tmp_path / "clf.pt"
    torch.save(bm.classifier().state_dict(), path)
    result = verify_run(
        VerifyCheckpointRequest(
            path=str(path), model=f"{MODELS}:classifier", inputs=f"{MODELS}:pair_batch", load_and_run=True
        ),
        job,
    )
    assert result.load_and_run.forward_ran, result.load_and_run.error
    assert result.load_and_run.batch_rule.batch == "inputs_target"
