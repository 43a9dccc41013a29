"""Measure the CPU peak the zoo-family memory scenarios compare estimate_memory with.

Run from the repository root (needs the [zoo] extra; about 30 s):

    python evals/models/zoo_truth.py                   # every family in evals/scenarios/zoo_families.py
    python evals/models/zoo_truth.py mixtral gat       # a subset

For each model it runs three real AdamW training steps (the step estimate_memory models by default:
fp32, the batch rule's loss, foreach=False as on a CPU) under torch_skills.memory.groundtruth,
which sums the CPU allocator's allocation events from the profiler, and prints the peak in bytes.
Paste the figures into FAMILIES in evals/scenarios/zoo_families.py when a model changes.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tools"), str(REPO)]

import torch  # noqa: E402

from evals.models import zoo_families  # noqa: E402
from evals.scenarios.zoo_families import FAMILIES  # noqa: E402
from torch_skills.memory.groundtruth import measure_real_step  # noqa: E402
from torch_skills.memory.trace import StepSpec  # noqa: E402
from torch_skills.runner.usercode import rule_loss  # noqa: E402


def measured_peak(name: str, inputs: str) -> int:
    """Peak live CPU-allocator bytes over three real AdamW steps of `name` on `inputs()`."""
    make = getattr(zoo_families, inputs)

    def loss(output, batch):
        target = batch[-1] if isinstance(batch, tuple) else None  # the (inputs..., target) rule
        return rule_loss(output, target)[0]

    truth = measure_real_step(
        getattr(zoo_families, name),
        lambda b: make() if b is None else make(b),
        loss,
        StepSpec(mode="train", optimizer="adamw", foreach=False),
        batch_size=None,
        device="cpu",
    )
    return truth.peak_allocated_bytes


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    for name in names or list(FAMILIES):
        print(f"{name:14s} {measured_peak(name, FAMILIES[name].inputs):>12d}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
