"""estimate_memory's logic, in-process: exact arithmetic on simple models and real runs on small ones."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures import memory_models as zoo
from torch_skills.memory.estimate import Target, estimate_trace
from torch_skills.memory.groundtruth import measure_real_step
from torch_skills.memory.ledger import ALLOC, FREE, StorageLedger
from torch_skills.memory.modules import ModuleScope
from torch_skills.memory.timeline import replay_events
from torch_skills.memory.trace import StepSpec, fake_mode, trace_step
from torch_skills.runner.usercode import default_loss

LINEAR_PARAMS = 4096 * 4096 + 4096  # weight + bias of nn.Linear(4096, 4096)
FP32 = 4


def mean_loss(output, batch):
    return default_loss(output)


def linear_4096():
    return torch.nn.Linear(4096, 4096)


def one_row(batch_size=None):
    return torch.randn(batch_size or 1, 4096)  # (B, 4096)


def test_linear_4096_with_adam_holds_params_grads_and_two_states_to_the_byte():
    """nn.Linear(4096, 4096) + Adam on CPU: the peak holds P*4 parameters, P*4 gradients, 2*P*4 + 2 step counters."""
    spec = StepSpec(optimizer="adam")
    trace = trace_step(linear_4096, one_row, mean_loss, spec)
    est = estimate_trace(trace, Target(cuda=False))
    assert est.phase == "optimizer_step"
    assert est.breakdown["parameters"] == LINEAR_PARAMS * FP32 == 67_125_248
    assert est.breakdown["gradients"] == LINEAR_PARAMS * FP32
    # exp_avg and exp_avg_sq per parameter, plus Adam's float32 `step` tensor per parameter (4 B each)
    assert est.breakdown["optimizer_state"] == 2 * LINEAR_PARAMS * FP32 + 2 * 4
    assert est.peak_allocated == sum(est.breakdown.values())


def test_the_cuda_target_rounds_every_storage_to_512_bytes():
    """For CUDA the 4-byte Adam step counters occupy 512-byte blocks; 64 MiB and 16 KiB tensors need no rounding."""
    spec = StepSpec(optimizer="adam", foreach=True)
    trace = trace_step(linear_4096, one_row, mean_loss, spec)
    est = estimate_trace(trace, Target(cuda=True))
    assert est.breakdown["parameters"] == LINEAR_PARAMS * FP32
    assert est.breakdown["optimizer_state"] == 2 * LINEAR_PARAMS * FP32 + 2 * 512
    # two cuBLAS workspaces (forward + backward thread) and the forward's 1 MiB cuBLASLt one (addmm)
    assert est.workspace_bytes == 2 * (4096 * 1024 * 2 + 16 * 1024 * 8) + 1024 * 1024
    assert est.peak_reserved >= est.peak_allocated


def test_bf16_training_halves_every_static_category():
    """precision='bf16' casts the model: parameters, gradients and Adam state take 2 bytes per element."""
    trace = trace_step(linear_4096, one_row, mean_loss, StepSpec(optimizer="adam", precision="bf16"))
    est = estimate_trace(trace, Target(cuda=False))
    assert est.breakdown["parameters"] == LINEAR_PARAMS * 2
    assert est.breakdown["gradients"] == LINEAR_PARAMS * 2
    assert est.breakdown["optimizer_state"] == 2 * LINEAR_PARAMS * 2 + 2 * 4


def test_building_under_fake_tensors_allocates_nothing_for_a_large_model():
    """A 2 GiB Linear built and stepped on fake tensors leaves the process's resident memory where it was."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trace = trace_step(
        lambda: torch.nn.Linear(16384, 32768), lambda b: torch.randn(4, 16384), mean_loss, StepSpec()
    )
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert trace.param_bytes == (16384 * 32768 + 32768) * 4 > 2 * 2**30
    assert after - before < 256 * 2**20


@pytest.mark.parametrize(
    ("name", "mode", "precision", "batch"),
    [
        ("mlp", "train", "fp32", 32),
        ("mlp", "inference", "fp32", 32),
        ("cnn_bn", "train", "fp32", 4),
        ("gpt_sdpa", "train", "bf16_autocast", 2),
        ("lstm", "train", "fp32", 4),
        ("gpt_checkpointed", "train", "fp32", 2),
        ("unet", "inference", "fp32", 2),
    ],
)
def test_the_traced_peak_matches_a_real_run_of_a_small_model(name, mode, precision, batch):
    """The fake-tensor estimate is within 2% of the CPU allocator's measured peak for the same step."""
    build, inputs, loss, _ = zoo.ZOO[name]
    loss = loss or mean_loss
    spec = StepSpec(mode=mode, optimizer="adam", precision=precision)
    trace = trace_step(build, inputs, loss, spec, batch_size=batch)
    estimate = estimate_trace(trace, Target(cuda=False)).peak_allocated
    truth = measure_real_step(build, inputs, loss, spec, batch_size=batch, steps=2).peak_allocated_bytes
    assert estimate == pytest.approx(truth, rel=0.02)


def test_a_view_shares_its_base_storage_and_is_counted_once():
    """Two views of one 4 KiB tensor add nothing; the storage is freed only when all three are gone."""
    ledger = StorageLedger()
    with ledger:
        base = torch.zeros(1024)  # 4096 bytes
        view_a, view_b = base[:512], base.view(32, 32)
        del base, view_a
        alive_with_one_view = [tag for tag, _ in ledger.events].count(FREE)
        del view_b
    allocs = [rec for tag, rec in ledger.events if tag == ALLOC]
    assert [rec.nbytes for rec in allocs] == [4096]
    assert alive_with_one_view == 0
    assert [tag for tag, _ in ledger.events].count(FREE) == 1


def test_saved_activations_are_attributed_to_the_first_module_that_saved_them():
    """In Linear-ReLU-(Linear-GELU)x3-Linear each (B, 1024) hidden tensor is counted once, for its first saver."""
    trace = trace_step(zoo.build_mlp, zoo.mlp_inputs, mean_loss, StepSpec(optimizer="none"), batch_size=64)
    replay = replay_events(trace.events, cuda=False)
    hidden = 64 * 1024 * FP32  # (B, 1024) float32
    # ReLU "1" saves its output (which Linear "2" saves too); GELUs save their inputs, Linears after a GELU theirs.
    # The batch saved by Linear "0" is an input, and weights are parameters: neither counts as an activation.
    assert replay.saved_by_module == {
        "1": hidden,
        "3": hidden,
        "4": hidden,
        "5": hidden,
        "6": hidden,
        "7": hidden,
        "8": hidden,
    }
    assert replay.activation_bytes == 7 * hidden


def test_the_module_scope_names_modules_in_forward_and_in_backward():
    """ModuleScope reports the innermost module by qualified name, in forward and, through gradient hooks, in backward."""
    seen = {"forward": [], "backward": []}

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            seen["backward"].append(scope.current())
            return grad

    class SpyModule(torch.nn.Module):
        def forward(self, x):
            seen["forward"].append(scope.current())
            return Spy.apply(x)

    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.Sequential(SpyModule(), torch.nn.ReLU()), torch.nn.Linear(8, 1)
    )
    scope = ModuleScope(model)
    with scope:
        model(torch.randn(4, 8)).sum().backward()
        outside = scope.current()
        scope.close_backward()
    assert seen == {"forward": ["1.0"], "backward": ["1.0"]}
    assert scope.current() == "" and outside in ("", "0")


def test_activation_checkpointing_by_class_name_cuts_saved_activations():
    """Recomputing each GPTBlock saves only block inputs: activations at the end of forward drop by more than half."""
    build, inputs, loss, batch = zoo.ZOO["gpt_sdpa"]
    plain = trace_step(build, inputs, loss, StepSpec(), batch_size=batch)
    ckpt = trace_step(build, inputs, loss, StepSpec(checkpoint_classes=("GPTBlock",)), batch_size=batch)
    a_plain = replay_events(plain.events, cuda=False).activation_bytes
    a_ckpt = replay_events(ckpt.events, cuda=False).activation_bytes
    assert ckpt.checkpointed_modules == 4
    assert a_ckpt < a_plain / 2


def test_fake_mode_builds_parameters_with_nn_init():
    """nn.init runs on fake parameters (no data, right shapes), so factories need no change."""
    with fake_mode():
        layer = torch.nn.Conv2d(3, 8, 3)
        torch.nn.init.kaiming_normal_(layer.weight)
    assert type(layer.weight).__name__ == "FakeTensor" and layer.weight.shape == (8, 3, 3, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", ["gpt_sdpa:train:bf16_autocast", "resnet:train:fp32", "lstm:inference:fp32"])
def test_on_a_gpu_the_estimate_matches_max_memory_allocated(case):
    """On CUDA, in a fresh process: estimate within 5% of max_memory_allocated, reserved within 10% of max_memory_reserved."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "bench/memory_accuracy.py", "--one", case, "--device", "cuda"],
        capture_output=True,
        text=True,
        check=True,
        cwd=repo,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["estimate"] == pytest.approx(row["truth"], rel=0.05)
    assert row["estimate_reserved"] == pytest.approx(row["truth_reserved"], rel=0.10)
