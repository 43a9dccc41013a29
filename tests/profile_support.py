"""Shared helper for the profile_model verdict tests: `evidence(**changes)` builds the StepEvidence of
a 10 ms CPU step of long matmuls at the attainable rate, with any figure overridden."""

from __future__ import annotations

from torch_skills.profiling.classify import StepEvidence


def evidence(**changes) -> StepEvidence:
    """A 10 ms CPU step of long matmuls at the attainable rate; `changes` override any figure."""
    base = dict(
        on_gpu=False,
        step_time_s=0.010,
        data_wait_share=None,
        work_fraction=0.9,
        flops_per_step=1e9,
        attainable_flops_per_s=1e11,
        bytes_per_step=1e6,
        attainable_bytes_per_s=1e10,
        ops_per_step=40,
        median_op_time_s=1e-3,
        per_op_overhead_s=2e-6,
        host_syncs_per_step=0,
    )
    return StepEvidence(**{**base, **changes})
