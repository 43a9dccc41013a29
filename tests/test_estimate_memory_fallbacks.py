"""estimate_memory on real-run fallbacks, kernel scratch and checkpointing advice, called in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.fixtures import fallback_models as fx
from torch_skills.memory.blocks import checkpoint_candidates
from torch_skills.memory.findings import _trace_advice
from torch_skills.memory.groundtruth import measure_real_step
from torch_skills.memory.models import EstimateMemoryRequest
from torch_skills.memory.probes import KernelProbe
from torch_skills.memory.trace import StepSpec, fake_mode
from torch_skills.runner.child import JobContext
from torch_skills.runner.usercode import default_loss

REPO = Path(__file__).resolve().parents[1]
MODELS = "tests/fixtures/fallback_models.py"


@pytest.fixture
def job(tmp_path):
    return JobContext(tmp_path, "cpu", [str(REPO)], str(REPO))


def run(job, **fields):
    from torch_skills.memory.worker import run as run_tool

    return run_tool(EstimateMemoryRequest(target_device="cpu", optimizer="adam", **fields), job)


def truth(build, inputs, batch_size: int, mode: str = "train") -> int:
    spec = StepSpec(optimizer="adam", mode=mode)
    return measure_real_step(
        build, inputs, lambda out, batch: default_loss(out), spec, batch_size=batch_size
    ).peak_allocated_bytes


@pytest.mark.parametrize("mode", [pytest.param("train", marks=pytest.mark.slow), "inference"])
def test_a_real_run_fallback_counts_the_convolution_scratch_the_allocator_sees(job, mode):
    """A conv stack that cannot be traced is measured for real: its im2col scratch is in the peak (within 1%)."""
    result = run(
        job,
        model=f"{MODELS}:build_conv_reads_value",
        inputs=f"{MODELS}:audio_inputs",
        batch_size=2,
        mode=mode,
    )
    assert result.method == "measured"
    assert result.kernel_scratch_bytes > 0
    assert result.kernel_scratch_bytes <= result.breakdown.temporaries
    real = truth(fx.build_conv_reads_value, fx.audio_inputs, 2, mode)
    assert result.peak_allocated_bytes == pytest.approx(real, rel=0.01)


def test_an_error_only_fake_tensors_raise_is_called_the_tools_limit_not_the_users(job):
    """grouped_mm in fp32 fails only on fake tensors: the message says it is not the user's bug, with nothing to fix."""
    result = run(job, model=f"{MODELS}:build_grouped_experts", inputs=f"{MODELS}:token_inputs")
    finding = next(f for f in result.findings if f.code == "trace_failed_extrapolated")
    assert "grouped_mm" in finding.message and "not a bug in your code" in finding.message
    assert "Fix the error" not in finding.message and finding.severity == "info"


def test_with_no_batch_size_the_fallback_reports_the_batch_the_inputs_function_returns(job):
    """An inputs function that returns batch 1 by itself: the fallback measures and reports batch 1, not 2."""
    result = run(job, model=f"{MODELS}:build_grouped_experts", inputs=f"{MODELS}:token_inputs")
    assert result.method == "measured" and result.batch_size == 1
    assert "batch size 1" in result.method_detail


def test_a_value_read_inside_an_installed_library_is_not_the_users_to_move():
    """A data-dependent branch in site-packages (LayerDrop) gets no 'move it out of forward' advice."""
    failure = (
        "the step (forward, loss or backward) reads a tensor's value (.item(), .tolist(), float(t), `if t:`) at "
        "/venv/lib/python3.11/site-packages/transformers/models/wav2vec2/modeling_wav2vec2.py:692 (if not skip)"
    )
    advice = _trace_advice(failure, "measured")
    assert "out of forward" not in advice and "installed library" in advice
    assert "out of forward" in _trace_advice(
        failure.replace("/venv/lib/python3.11/site-packages", "/home/me"), "measured"
    )


def test_checkpointing_advice_names_the_block_class_with_its_peak_never_a_module_list(job):
    """Two ModuleLists of Blocks: the advice is Block, with the peak an estimate with Block checkpointed gives."""
    result = run(job, model=f"{MODELS}:build_two_stacks", inputs=f"{MODELS}:stack_inputs")
    finding = next(f for f in result.findings if f.code == "activations_dominate")
    assert "ModuleList" not in finding.message and "['Block']" in finding.message
    [option] = result.checkpointing_options
    checkpointed = run(
        job,
        model=f"{MODELS}:build_two_stacks",
        inputs=f"{MODELS}:stack_inputs",
        activation_checkpointing=["Block"],
    )
    assert option.block_class == "Block"
    assert option.peak_allocated_bytes == checkpointed.peak_allocated_bytes < result.peak_allocated_bytes


def test_checkpoint_candidates_skip_containers_and_leaves_and_rank_by_saved_bytes():
    """ModuleList (no forward) and leaf classes are never candidates; blocks are ranked by what they save."""
    types = {
        "": "Net",
        "enc": "ModuleList",
        "enc.0": "Block",
        "enc.0.fc": "Linear",
        "enc.1": "Block",
        "enc.1.fc": "Linear",
        "dec": "ModuleList",
        "dec.0": "Small",
        "dec.0.fc": "Linear",
        "dec.1": "Small",
        "dec.1.fc": "Linear",
    }
    saved = {"enc.0.fc": 10, "enc.1.fc": 10, "dec.0.fc": 5, "dec.1": 1}
    assert checkpoint_candidates(types, saved) == ["Block", "Small"]


def test_a_convolution_over_the_probe_size_limit_gets_its_scratch_from_batches_2_and_3():
    """Over max_bytes, a conv is probed at batches 2 and 3 and scaled to 8: within 2% of the full probe, not dropped."""
    aten = torch.ops.aten
    with fake_mode():
        x, w = torch.empty(8, 1, 4000), torch.empty(64, 1, 10)  # (B, C, T), (C_out, C_in, K)
    args = (x, w, None, [5], [0], [1], False, [0], 1)
    full = KernelProbe("cpu", scratch=True).measure(aten.convolution.default, args, {})
    small = KernelProbe("cpu", scratch=True, max_bytes=64_000)  # batch 8's input is 128 kB, batch 3's 48 kB
    scaled = small.measure(aten.convolution.default, args, {})
    assert full.scratch_bytes > 0 and small.scaled == 1 and small.skipped == 0
    assert scaled.scratch_bytes == pytest.approx(full.scratch_bytes, rel=0.02)


def test_cpu_flash_attention_scratch_is_in_the_traced_peak(job):
    """The CPU flash-attention kernel's per-thread blocks are probed: the traced peak matches the allocator's."""
    result = run(
        job,
        model=f"{MODELS}:build_self_attention",
        inputs=f"{MODELS}:attention_inputs",
        mode="inference",
    )
    assert result.method == "traced" and result.kernel_scratch_bytes > 0
    real = truth(fx.build_self_attention, fx.attention_inputs, 2, "inference")
    assert result.peak_allocated_bytes == pytest.approx(real, rel=0.005)
