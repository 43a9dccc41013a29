"""profile_model under machine load: the verdict holds or says it is uncertain; thread wording matches the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.profile_support import evidence
from torch_skills.profiling.classify import COUNT_FACTOR, classify
from torch_skills.profiling.findings import findings_for
from torch_skills.profiling.models import ProfileRequest, ProfileResult
from torch_skills.profiling.worker import run
from torch_skills.runner.child import JobContext

REPO = Path(__file__).resolve().parents[1]
SCENARIO_MODELS = REPO / "evals" / "models" / "profile_model_scenarios.py"


# -- uncertainty from figures load does not change ---------------------------------------------------
def test_a_clear_compute_bound_step_is_certain():
    """Work far above overhead in both the timings and the counts: no doubt is raised."""
    verdict = classify(evidence())
    assert (verdict.bottleneck, verdict.uncertain) == ("compute", [])


def test_shares_within_the_margin_make_the_verdict_uncertain():
    """Host overhead 52% against work 48% is a call that load can flip: it is flagged."""
    verdict = classify(evidence(work_fraction=0.48, ops_per_step=2000, flops_per_step=1e6))
    assert verdict.bottleneck == "cpu_overhead"
    assert any("within 15%" in reason for reason in verdict.uncertain)


def test_timed_overhead_that_the_counts_call_work_is_uncertain():
    """Timings that say overhead while 40 ops cannot cost what 1 GFLOP does: flagged, counts quoted."""
    verdict = classify(evidence(work_fraction=0.1))  # a loaded run's long ops preempted into 'small' ones
    overhead, work = 40 * 2e-6, 1e9 / 1e11
    assert work >= COUNT_FACTOR * overhead
    assert verdict.bottleneck == "cpu_overhead"
    assert any("the counts say work" in reason for reason in verdict.uncertain)


def test_timed_work_that_the_counts_call_overhead_is_uncertain():
    """Timings that say work while 5000 tiny dispatches outweigh the arithmetic: flagged."""
    verdict = classify(
        evidence(work_fraction=0.95, ops_per_step=5000, flops_per_step=5e8, bytes_per_step=1e6)
    )
    assert verdict.bottleneck == "compute"
    assert any("the counts say host overhead" in reason for reason in verdict.uncertain)


def test_a_roofline_verdict_on_unsteady_attainable_rates_is_uncertain():
    """Calibration repetitions 5x apart (a contended machine) put the compute/memory call in doubt."""
    steady, contended = classify(evidence()), classify(evidence(calibration_spread=5.0))
    assert steady.uncertain == [] and contended.bottleneck == "compute"
    assert any("varied 5.0x" in reason for reason in contended.uncertain)


def test_a_roofline_verdict_on_unsteady_steps_is_uncertain():
    """Timed steps 3x apart put a work-side verdict in doubt; steady steps do not."""
    assert classify(evidence(step_spread=1.2)).uncertain == []
    assert any("3.0x the fastest" in reason for reason in classify(evidence(step_spread=3.0)).uncertain)


def test_a_step_near_the_unknown_line_of_the_roofline_is_uncertain():
    """10% of the attainable matmul rate is near the 5% line between 'compute' and 'unknown': flagged."""
    verdict = classify(evidence(flops_per_step=1e8))
    assert verdict.bottleneck == "compute"
    assert any("close to the 5%" in reason for reason in verdict.uncertain)


def test_flops_done_faster_than_the_attainable_rate_expose_a_loaded_calibration():
    """1 GFLOP in a 2 ms fastest step against 100 GFLOP/s attainable: that rate was measured under load."""
    verdict = classify(evidence(fastest_step_s=0.002))
    assert any("5.0x faster than the attainable matmul rate" in reason for reason in verdict.uncertain)


def test_the_roofline_compares_against_the_fastest_step():
    """A median stretched by load does not shrink the compute share: the fastest step is used."""
    assert classify(evidence(step_time_s=0.050, fastest_step_s=0.010)).shares.compute == pytest.approx(1.0)


def test_the_count_estimates_are_part_of_the_evidence():
    """The overhead and work estimates from counts are reported with the shares."""
    metrics = {e.metric: e.value for e in classify(evidence()).evidence}
    assert metrics["count_overhead_estimate_s"] == pytest.approx(40 * 2e-6)
    assert metrics["count_work_estimate_s"] == pytest.approx(1e9 / 1e11)


# -- the same scenario with and without a competing busy process ----------------------------------
SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "shape"),
    [("tiny_ops", [4, 16]), ("big_matmul", [512, 1024]), ("flops_mlp", [32, 64]), ("small_mlp", [256, 64])],
)
def test_a_busy_machine_gives_the_same_verdict_or_says_it_is_uncertain(model, shape, tmp_path):
    """One spinning process per core during the run: same bottleneck as without them, or the flag is set."""
    request = ProfileRequest(model=f"{SCENARIO_MODELS}:{model}", input_shape=shape, mode="inference")
    job = JobContext(tmp_path, "cpu", [str(REPO)], str(REPO))  # the job folder takes its progress file
    quiet = run(request, job)
    cores = len(os.sched_getaffinity(0))
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=120)]) for _ in range(max(cores, 2))
    ]
    try:
        busy = run(request, job)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    agree = quiet.bottleneck == busy.bottleneck
    assert agree or quiet.verdict_uncertain or busy.verdict_uncertain, (
        f"quiet: {quiet.bottleneck} {quiet.uncertainty}; busy: {busy.bottleneck} {busy.uncertainty}"
    )


# -- thread wording --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_thread(tmp_path_factory) -> ProfileResult:
    """A small MLP's inference step profiled with cpu_threads=1."""
    job = JobContext(tmp_path_factory.mktemp("job"), "cpu", [str(REPO)], str(REPO))
    request = ProfileRequest(
        model=f"{SCENARIO_MODELS}:small_mlp",
        input_shape=[32, 64],
        mode="inference",
        active_steps=3,
        cpu_threads=1,
    )
    return run(request, job)


def test_a_one_thread_run_says_1_thread(one_thread):
    """cpu_threads=1 is what the result and the summary report, whatever torch's default is."""
    assert one_thread.cpu_threads == 1
    assert one_thread.device_name.endswith("(1 thread)")
    assert "(1 thread)" in one_thread.summary and "threads)" not in one_thread.summary


def test_contention_on_a_one_thread_run_does_not_advise_one_thread(one_thread):
    """An oversubscribed run that already used cpu_threads=1 is not told to use cpu_threads=1."""
    findings = findings_for(one_thread.model_copy(update={"cpu_load": 3.0}))
    contention = [f for f in findings if f.code == "cpu_contention"]
    assert contention
    assert "cpu_threads=1" not in contention[0].message and "already used 1 thread" in contention[0].message


def test_contention_on_a_multi_thread_run_advises_one_thread(one_thread):
    """With several threads the same warning names cpu_threads=1 as the next step."""
    loaded = one_thread.model_copy(update={"cpu_load": 3.0, "cpu_threads": 4})
    contention = [f for f in findings_for(loaded) if f.code == "cpu_contention"]
    assert (
        contention
        and "cpu_threads=1" in contention[0].message
        and "4 intra-op threads" in contention[0].message
    )
