"""Figures keep their significant digits, and advice follows what was measured and the target device."""

from __future__ import annotations

from torch_skills.profiling.findings import _loader_advice, _pct
from torch_skills.profiling.models import LoaderInfo
from torch_skills.results import format_number


def test_small_rates_keep_significant_digits():
    """0.4 samples/s is not '0'; large figures get thousands separators."""
    assert format_number(0.4213) == "0.421"
    assert format_number(3.14159) == "3.14"
    assert format_number(12345.6) == "12,346"
    assert format_number(0) == "0"


def test_small_shares_are_not_rounded_to_zero():
    """A 0.34% share reads 0.34%, a 42% share 42%."""
    assert _pct(0.0034) == "0.34%" and _pct(0.42) == "42%" and _pct(None) == "n/a"


class _R:
    def __init__(self, loader, device="cpu"):
        self.loader, self.device = loader, device


def test_loader_advice_never_suggests_workers_to_a_loader_that_has_them():
    """num_workers=4 already: the advice is about per-sample work, not more workers."""
    text = _loader_advice(_R(LoaderInfo(type="DataLoader", num_workers=4, persistent_workers=True)))
    assert "num_workers=4" in text and "num_workers > 0" not in text and "per-sample work" in text


def test_loader_advice_suggests_workers_only_to_a_single_process_loader():
    """num_workers=0: try workers; pin_memory only on a GPU."""
    cpu = _loader_advice(_R(LoaderInfo(type="DataLoader", num_workers=0, pin_memory=False)))
    gpu = _loader_advice(_R(LoaderInfo(type="DataLoader", num_workers=0, pin_memory=False), device="cuda:0"))
    assert "num_workers > 0" in cpu and "pin_memory" not in cpu and "pin_memory=True" in gpu


def test_an_unknown_loader_gets_advice_to_measure_it_alone():
    """A plain iterable: no claims about workers it may not have."""
    text = _loader_advice(_R(LoaderInfo(type="list")))
    assert "num_workers" not in text and "alone" in text


def test_memory_findings_for_a_cpu_target_never_blame_foreach(tmp_path):
    """foreach is CUDA's optimizer default: a CPU-target estimate does not mention it."""
    from pathlib import Path

    from torch_skills.memory.models import EstimateMemoryRequest
    from torch_skills.memory.worker import run
    from torch_skills.runner.child import JobContext

    fixtures = Path(__file__).parent / "fixtures"
    job = JobContext(tmp_path, "cpu", [str(fixtures)], str(tmp_path))
    for target in ("cpu", "cuda"):
        result = run(
            EstimateMemoryRequest(
                model=f"{fixtures / 'gradient_zoo.py'}:healthy_mlp",
                input_shape=[2, 16],
                target_device=target,
                device="cpu",
            ),
            job,
        )
        if target == "cpu":
            assert not any("foreach" in f.message for f in result.findings), result.findings
