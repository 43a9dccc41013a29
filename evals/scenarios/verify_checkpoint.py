"""Eval scenarios for verify_checkpoint (files: evals/models/verify_checkpoint_*)."""

from __future__ import annotations

from evals.framework import Expect, Scenario

NET = "evals/models/verify_checkpoint_net.py"
FILES = "evals/models/verify_checkpoint"

SCENARIOS: list[Scenario] = [
    Scenario(
        id="checkpoint-exec-payload-is-named-not-run",
        tool="verify_checkpoint",
        arguments={"path": f"{FILES}_payload.pkl"},
        expect=[
            Expect("safe", "eq", False),
            Expect("verdict", "eq", "unsafe"),
            Expect("loaded", "eq", False),
            Expect("unsafe_globals[*].qualified", "contains", "builtins.exec"),
            Expect("unsafe_globals[0].risk", "eq", "code_execution"),
            Expect("unsafe_globals[0].called_at", "not_null"),
            Expect("findings[*].code", "contains", "unsafe_global"),
        ],
        description="a pickle calling builtins.exec is reported with its offset; nothing is unpickled",
    ),
    Scenario(
        id="checkpoint-ddp-prefix-fixed-and-run",
        tool="verify_checkpoint",
        arguments={
            "path": f"{FILES}_ddp.pt",
            "model": f"{NET}:build",
            "load_and_run": True,
            "input_shape": [2, 8],
        },
        expect=[
            Expect("safe", "eq", True),
            Expect("key_mismatch.matched_as_is", "eq", 0),
            Expect("key_mismatch.prefix_fix.remove_components", "contains", "module"),
            Expect("key_mismatch.fits", "eq", True),
            Expect("load_and_run.loaded", "eq", True),
            Expect("load_and_run.output_shapes", "eq", [[2, 4]]),
        ],
        description="DDP's module. prefix is detected, applied, and the model loads strictly and runs",
    ),
    Scenario(
        id="checkpoint-wrong-width-model",
        tool="verify_checkpoint",
        arguments={"path": f"{FILES}_ddp.pt", "model": f"{NET}:build_wide"},
        expect=[
            Expect("key_mismatch.fits", "eq", False),
            Expect("key_mismatch.shape_mismatches[*].key", "contains", "fc1.weight"),
            Expect("findings[*].code", "contains", "shape_mismatch"),
        ],
        description="a model with another hidden size gets shape mismatches, not missing keys",
    ),
    Scenario(
        id="checkpoint-resume-gaps",
        tool="verify_checkpoint",
        arguments={"path": f"{FILES}_resume_gaps.pt"},
        expect=[
            Expect("resume.kind", "eq", "training"),
            Expect("missing_for_resume", "contains", "scheduler"),
            Expect("missing_for_resume", "contains", "rng_numpy"),
            Expect("missing_for_resume", "not_contains", "optimizer"),
            Expect("missing_for_resume", "not_contains", "rng_torch"),
            Expect("findings[*].code", "contains", "missing_for_resume"),
        ],
        description="a training checkpoint without scheduler, numpy/python/cuda RNG or sampler state",
    ),
    Scenario(
        id="checkpoint-nan-in-safetensors",
        tool="verify_checkpoint",
        arguments={"path": f"{FILES}_nan.safetensors"},
        expect=[
            Expect("format", "eq", "safetensors"),
            Expect("safe", "eq", True),
            Expect("verdict", "eq", "safe"),
            Expect("nonfinite_tensors[*].name", "eq", ["fc1.weight"]),
            Expect("nonfinite_tensors[0].nan", "eq", 1),
        ],
        description="a NaN in one weight is found by streaming the safetensors data",
    ),
    Scenario(
        id="checkpoint-missing-file",
        tool="verify_checkpoint",
        arguments={"path": f"{FILES}_does_not_exist.pt"},
        expect_error="no checkpoint at",
    ),
    Scenario(
        id="checkpoint-load-and-run-needs-inputs",
        tool="verify_checkpoint",
        arguments={"path": f"{FILES}_ddp.pt", "model": f"{NET}:build", "load_and_run": True},
        expect_error="input_shape",
    ),
]
