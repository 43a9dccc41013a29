"""profile_model's logic, tested in-process: statistics, peaks, op kinds, the verdict, the probe, the step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.profile_support import evidence
from torch_skills.profiling.calibrate import calibrate
from torch_skills.profiling.categories import op_category
from torch_skills.profiling.classify import classify
from torch_skills.profiling.compiled import compare_compiled
from torch_skills.profiling.findings import findings_for
from torch_skills.profiling.models import CompileReport, ProfileRequest, ProfileResult
from torch_skills.profiling.peaks import find_gpu, peak_flops
from torch_skills.profiling.probe import probe_step
from torch_skills.profiling.stats import summarize
from torch_skills.profiling.step import BatchSource, build_step
from torch_skills.profiling.trace import RawEvent, cpu_work_per_step, summarize_events
from torch_skills.profiling.worker import resolve_trace_path, run
from torch_skills.runner.child import JobContext
from torch_skills.runner.errors import UserCodeError

REPO = Path(__file__).resolve().parents[1]
SCENARIO_MODELS = REPO / "evals" / "models" / "profile_model_scenarios.py"
FIXTURE_MODELS = REPO / "tests" / "fixtures" / "profile_models.py"
CPU = torch.device("cpu")


@pytest.fixture
def job(tmp_path: Path) -> JobContext:
    return JobContext(tmp_path, "cpu", [str(REPO)], str(REPO))


def request(model: str, **kwargs) -> ProfileRequest:
    kwargs.setdefault("input_shape", [32, 64])
    return ProfileRequest(model=model, **kwargs)


# -- statistics ----------------------------------------------------------------------------------
def test_the_median_and_iqr_of_known_timings_are_exact():
    """Median and interquartile range follow the linear-interpolation definition."""
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (s.median, s.iqr, s.min, s.max) == (3.0, 2.0, 1.0, 100.0)
    assert s.noisy


def test_steady_timings_are_not_flagged_noisy():
    """An IQR within 10% of the median is not noise."""
    assert not summarize([1.00, 1.01, 1.02, 1.03, 1.04]).noisy


# -- GPU peaks -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "dtype", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 1979 / 2),
        ("NVIDIA H100 PCIe", "bf16", 1513 / 2),
        ("NVIDIA H200", "fp16", 1979 / 2),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156),
        ("NVIDIA A100 80GB PCIe", "bf16", 312),
        ("NVIDIA L4", "bf16", 242 / 2),
        ("NVIDIA GeForce RTX 4090", "fp16", 165.2),
        ("Tesla V100-SXM2-16GB", "fp16", 125),
    ],
)
def test_datasheet_peaks_are_the_dense_figures(name, dtype, tflops):
    """The table holds the vendor's dense peak (half the sparsity figure) for each GPU and dtype."""
    peak = peak_flops(name, dtype)
    assert peak is not None
    assert peak.flops_per_s == pytest.approx(tflops * 1e12)


def test_gpu_names_do_not_match_their_longer_cousins():
    """An L40S is not an L4 and an A100 is not an A10; the A10G entry says it is approximate."""
    assert find_gpu("NVIDIA L40S") is None
    assert find_gpu("NVIDIA A100 80GB PCIe").name == "A100"
    assert find_gpu("NVIDIA A10G").approximate
    assert find_gpu("NVIDIA A10").name == "A10"


def test_a_dtype_the_gpu_lacks_has_no_peak():
    """Volta has no bf16, Turing no tf32, and an unknown device no entry at all."""
    assert peak_flops("Tesla V100-PCIE-32GB", "bf16") is None
    assert peak_flops("Tesla T4", "tf32") is None
    assert peak_flops("Some Future Accelerator", "bf16") is None


# -- operator kinds ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("aten::addmm", "matmul"),
        ("aten::convolution_backward", "convolution"),
        ("aten::_convert_indices_from_coo_to_csr", "other"),
        ("aten::native_layer_norm", "normalization"),
        ("aten::_scaled_dot_product_flash_attention", "attention"),
        ("aten::gelu", "elementwise"),
        ("aten::sum", "reduction"),
        ("aten::copy_", "memory_copy"),
        ("aten::_local_scalar_dense", "host_sync"),
        ("cudaStreamSynchronize", "host_sync"),
        ("autograd::engine::evaluate_function: AddmmBackward0", "autograd"),
    ],
)
def test_operator_names_fall_into_their_kinds_of_work(name, kind):
    """Profiler names map to the kind of work they do."""
    assert op_category(name) == kind


def test_optimizer_ops_count_as_optimizer_but_syncs_stay_syncs():
    """Inside the optimizer phase an elementwise op is optimizer work; a value read stays a sync."""
    assert op_category("aten::mul_", phase="optimizer") == "optimizer"
    assert op_category("aten::_local_scalar_dense", phase="optimizer") == "host_sync"


# -- the verdict ---------------------------------------------------------------------------------


def test_a_step_mostly_waiting_on_the_loader_is_data_bound():
    """Loader wait larger than both the work and the overhead wins."""
    verdict = classify(evidence(data_wait_share=0.7, work_fraction=0.9))
    assert verdict.bottleneck == "data_loading"
    assert verdict.shares.work == pytest.approx(0.3 * 0.9)


def test_a_step_of_many_tiny_ops_is_overhead_bound():
    """Almost no time in substantial ops and hundreds of dispatches: host overhead."""
    verdict = classify(
        evidence(work_fraction=0.02, ops_per_step=2000, median_op_time_s=1e-6, flops_per_step=0)
    )
    assert verdict.bottleneck == "cpu_overhead"
    assert verdict.shares.host_overhead == pytest.approx(0.98)


def test_long_matmuls_near_the_attainable_rate_are_compute_bound():
    """1 GFLOP in 10 ms against 100 GFLOP/s attainable is the whole step: compute."""
    verdict = classify(evidence())
    assert verdict.bottleneck == "compute"
    assert verdict.shares.compute == pytest.approx(1.0)


def test_long_ops_moving_many_bytes_per_flop_are_memory_bound():
    """No FLOPs and 50 MB moved at 10 GB/s in a 10 ms step: memory bandwidth."""
    verdict = classify(evidence(flops_per_step=0, bytes_per_step=5e7))
    assert verdict.bottleneck == "memory_bandwidth"
    assert verdict.shares.memory_bandwidth == pytest.approx(0.5)


def test_long_ops_far_from_both_limits_are_unknown():
    """Work that neither the FLOPs nor the bytes explain is not called compute or memory."""
    assert classify(evidence(flops_per_step=1e6, bytes_per_step=1e4)).bottleneck == "unknown"


def test_host_time_without_many_ops_is_unknown():
    """Time outside ops with only a few dispatches (a sleep, file I/O) is not op overhead."""
    assert classify(evidence(work_fraction=0.1, ops_per_step=3)).bottleneck == "unknown"


def test_the_shares_of_the_step_add_up_to_one():
    """Data wait, work and host overhead partition the step."""
    s = classify(evidence(data_wait_share=0.25, work_fraction=0.6)).shares
    assert s.data_wait + s.work + s.host_overhead == pytest.approx(1.0)


# -- the profiler's events -------------------------------------------------------------------------
def ev(name: str, start_us: float, end_us: float, annotation: bool = False) -> RawEvent:
    return RawEvent(name, int(start_us * 1000), int(end_us * 1000), 1, 0, 0, False, annotation)


def test_self_time_excludes_children_and_ops_are_charged_to_their_phase():
    """aten::linear's self time leaves out its addmm; both land in the forward phase."""
    events = [
        ev("ProfilerStep#1", 0, 1000, annotation=True),
        ev("## phase: forward", 10, 900, annotation=True),
        ev("aten::linear", 20, 820),
        ev("aten::addmm", 30, 810),
        ev("## calibration: tiny ops", 950, 990, annotation=True),
        ev("aten::add", 955, 957),
    ]
    summary = summarize_events(events, on_gpu=False, small_op_s=1e-5, top_k=5)
    ops = {op.name: op for op in summary["top_ops"]}
    assert ops["aten::addmm"].self_cpu_time_s == pytest.approx(780e-6)
    assert ops["aten::linear"].self_cpu_time_s == pytest.approx(20e-6)
    assert "aten::add" not in ops  # the yardstick is not the user's op
    assert summary["small_op_s"] == pytest.approx(20 * 2e-6)
    assert summary["phases"][0].phase == "forward"
    assert summary["phases"][0].cpu_time_s == pytest.approx(890e-6)
    assert summary["work_fraction"] == pytest.approx(780 / 890)


def test_a_preempted_tiny_call_is_not_mistaken_for_work():
    """A 3 us op that once took 5 ms stays overhead; a 1 ms op counts with its time in each step."""
    calls = []
    for step in range(5):
        tiny = 5e-3 if step == 2 else 3e-6
        calls += [
            (step, step * 10_000 + 1, "aten::add", tiny),
            (step, step * 10_000 + 2, "aten::mm", 1e-3 + step * 1e-5),
        ]
    work = cpu_work_per_step(calls, small_op_s=3e-5)
    assert work == pytest.approx({step: 1e-3 + step * 1e-5 for step in range(5)})


# -- the probe: FLOPs, bytes, syncs --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "flops"),
    [("inference", 2 * 32 * (64 * 128 + 128 * 10)), ("train", 32 * (4 * 64 * 128 + 6 * 128 * 10))],
)
def test_flops_of_an_mlp_equal_the_linear_arithmetic(job, mode, flops):
    """2*B*in*out per Linear forward; training adds weight and input gradients (none for the input layer)."""
    runner = build_step(request(f"{SCENARIO_MODELS}:flops_mlp", mode=mode), job, CPU)
    probe = probe_step(runner)
    assert probe.flops == flops
    assert probe.module_flops["0"] + probe.module_flops["2"] == flops


def test_bytes_moved_by_a_bias_free_linear_are_its_input_weight_and_output(job):
    """One matmul reads x and W and writes y; the transpose is a view and moves nothing."""
    runner = build_step(
        request(f"{FIXTURE_MODELS}:bias_free_linear", input_shape=[8, 64], mode="inference"), job, CPU
    )
    assert probe_step(runner).bytes_moved == 4 * (8 * 64 + 64 * 32 + 8 * 32)


def test_item_calls_are_named_with_module_and_line_and_adamw_counters_are_left_out(job):
    """Each block's .item() is one sync in its own module at its source line; AdamW's step reads are not."""
    lines = SCENARIO_MODELS.read_text().splitlines()
    item_line = next(i + 1 for i, text in enumerate(lines) if ".item()" in text)
    runner = build_step(request(f"{SCENARIO_MODELS}:sync_every_layer", input_shape=[16, 32]), job, CPU)
    syncs = probe_step(runner).syncs
    assert sorted(s.module for s in syncs) == [f"blocks.{i}" for i in range(8)]
    assert {s.location for s in syncs} == {f"{SCENARIO_MODELS}:{item_line}"}
    assert {s.phase for s in syncs} == {"forward"}
    assert sum(s.calls_per_step for s in syncs) == 8


def test_tolist_is_caught_although_no_op_is_dispatched(job):
    """.tolist() on a CPU tensor dispatches nothing; the Python hook still names it."""
    runner = build_step(
        request(f"{SCENARIO_MODELS}:value_logger", input_shape=[8, 16], mode="inference"), job, CPU
    )
    syncs = probe_step(runner).syncs
    assert [(s.op, s.module) for s in syncs] == [("Tensor.tolist()", None)]
    assert re.search(r"profile_model_scenarios\.py:\d+$", syncs[0].location)


def test_a_step_that_fails_only_under_the_probe_still_gets_a_profile(job):
    """The plain step ran, so a probe failure is reported as a finding and the timings still stand."""
    result = run(request(f"{FIXTURE_MODELS}:refuses_instrumentation", mode="inference", active_steps=3), job)
    assert "refusing to run under a profile hook" in result.probe_error
    assert result.flops_per_step == 0 and result.step_time_s > 0
    assert "probe_failed" in [f.code for f in result.findings]


# -- calibration, the step, the worker --------------------------------------------------------------
def test_the_calibration_measures_positive_rates():
    """A matmul rate, a copy rate and a tiny-op cost, from a power-of-two matmul size."""
    cal = calibrate(CPU, torch.float32)
    assert cal.matmul_flops_per_s > 0 and cal.copy_bytes_per_s > 0 and cal.tiny_op_s > 0
    assert cal.matmul_size >= 256 and cal.matmul_size & (cal.matmul_size - 1) == 0


@pytest.mark.parametrize("precision", ["bf16", "fp16", "bf16_autocast", "fp16_autocast"])
def test_every_precision_runs_a_training_step(job, precision):
    """Each precision trains; FLOPs do not depend on the dtype."""
    result = run(
        request(f"{SCENARIO_MODELS}:flops_mlp", precision=precision, warmup_steps=1, active_steps=3), job
    )
    assert result.precision == precision
    assert result.flops_per_step == 32 * (4 * 64 * 128 + 6 * 128 * 10)
    assert result.step_time_s > 0 and result.timing.times_s


def test_a_one_shot_generator_that_runs_out_says_how_to_fix_it():
    """A spent generator cannot restart: the message says to return a re-iterable loader."""
    source = BatchSource(iterable=(torch.ones(2, 3) for _ in range(2)), device=CPU)
    source.next()
    source.next()
    with pytest.raises(UserCodeError, match="one-shot iterator"):
        source.next()


def test_a_reiterable_loader_restarts_for_another_epoch():
    """A list of two batches serves five steps over three epochs."""
    source = BatchSource(iterable=[torch.ones(4, 3), torch.zeros(2, 3)], device=CPU)
    sizes = [source.next()[0].shape[0] for _ in range(5)]
    assert sizes == [4, 2, 4, 2, 4]
    assert source.epochs == 3


def test_batch_input_first_feeds_inputs_and_the_loss_sees_targets(job):
    """(inputs, targets) batches: the model gets batch[0], the loss the whole pair."""
    result = run(
        ProfileRequest(
            model=f"{FIXTURE_MODELS}:bias_free_linear",
            data=f"{FIXTURE_MODELS}:pair_loader",
            batch_input="first",
            loss=f"{FIXTURE_MODELS}:pair_loss",
            warmup_steps=1,
            active_steps=3,
        ),
        job,
    )
    assert result.samples_per_step == 8
    assert result.data_wait_share is not None


def test_batch_input_first_on_a_tensor_batch_says_what_to_use(job):
    """A plain tensor batch has no first item to pick: the message names batch_input='auto'."""
    with pytest.raises(UserCodeError, match="batch_input='auto'"):
        run(request(f"{FIXTURE_MODELS}:bias_free_linear", input_shape=[8, 64], batch_input="first"), job)


def test_a_trace_path_outside_the_roots_is_refused_in_the_worker_too(job):
    """The worker checks the trace path itself, not only the server."""
    with pytest.raises(UserCodeError, match="outside the allowed roots"):
        resolve_trace_path("/etc/profile.json", job)


def test_a_failing_compiler_becomes_a_failed_report_not_a_crash(job):
    """A backend that raises gives status 'failed' with its message."""

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no C++ compiler in this sandbox")

    runner = build_step(request(f"{SCENARIO_MODELS}:small_mlp"), job, CPU)
    report = compare_compiled(
        runner, 1e-3, warmup=1, active=3, compiler=lambda m: torch.compile(m, backend=broken_backend)
    )
    assert report.status == "failed"
    assert "no C++ compiler in this sandbox" in report.error


# -- findings ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> ProfileResult:
    """One real profile to vary: a small MLP's inference step."""
    job = JobContext(tmp_path_factory.mktemp("job"), "cpu", [str(REPO)], str(REPO))
    return run(request(f"{SCENARIO_MODELS}:flops_mlp", mode="inference", active_steps=3), job)


@pytest.mark.parametrize(
    ("bottleneck", "code", "skill"),
    [
        ("data_loading", "data_bound", "performance-profiling"),
        ("cpu_overhead", "overhead_bound", "performance-profiling"),
        ("compute", "compute_bound", "mixed-precision-and-optimization"),
        ("memory_bandwidth", "memory_bound", "tensor-operations-and-memory"),
        ("unknown", "bottleneck_unknown", "performance-profiling"),
    ],
)
def test_the_first_finding_names_the_skill_for_the_bottleneck(measured, bottleneck, code, skill):
    """The verdict's finding comes first and points at the specialist skill."""
    first = findings_for(measured.model_copy(update={"bottleneck": bottleneck}))[0]
    assert (first.code, first.skill) == (code, skill)


def test_a_failed_compile_and_graph_breaks_become_findings(measured):
    """Compiler trouble is reported as findings, with the error text."""
    failed = measured.model_copy(
        update={"compile": CompileReport(status="failed", error="BackendCompilerFailed: x")}
    )
    assert "compile_failed" in [f.code for f in findings_for(failed)]
    broken = CompileReport(status="ok", compile_time_s=1.0, step_time_s=1e-3, speedup=1.0, graph_breaks=2,
                           graph_break_reasons=["data-dependent branch"])  # fmt: skip
    codes = [f.code for f in findings_for(measured.model_copy(update={"compile": broken}))]
    assert "graph_breaks" in codes and "compile_no_gain" in codes


def test_an_oversubscribed_machine_is_reported(measured):
    """A load above one per core on a 2-thread run warns that CPU timings are unreliable and suggests cpu_threads=1."""
    findings = findings_for(measured.model_copy(update={"cpu_load": 3.0, "cpu_threads": 2}))
    contention = [f for f in findings if f.code == "cpu_contention"]
    assert contention and "cpu_threads=1" in contention[0].message
