"""Eval scenarios for estimate_memory: each names a model, the step, and what the result must say."""

from __future__ import annotations

from evals.framework import Expect, Scenario

M = "evals/models/estimate_memory_models.py"
LINEAR_BYTES = 67_125_248  # (4096 * 4096 + 4096) * 4

SCENARIOS: list[Scenario] = [
    Scenario(
        id="linear-adam-exact-bytes",
        tool="estimate_memory",
        description="Linear(4096, 4096) with Adam on CPU: parameters, gradients and two moments to the byte.",
        arguments={
            "model": f"{M}:linear_4096",
            "input_shape": [1, 4096],
            "optimizer": "adam",
            "target_device": "cpu",
        },
        expect=[
            Expect("method", "eq", "traced"),
            Expect("breakdown.parameters", "eq", LINEAR_BYTES),
            Expect("breakdown.gradients", "eq", LINEAR_BYTES),
            Expect("breakdown.optimizer_state", "eq", 2 * LINEAR_BYTES + 8),  # + two float32 step counters
            Expect("peak_phase", "eq", "optimizer_step"),
        ],
    ),
    Scenario(
        id="activations-dominate-suggests-checkpointing",
        tool="estimate_memory",
        description="Deep blocks on long sequences: activations dominate; the finding names the block class and the skill.",
        arguments={"model": f"{M}:deep_blocks", "inputs": f"{M}:deep_inputs", "optimizer": "adamw"},
        expect=[
            Expect("findings[*].code", "contains", "activations_dominate"),
            Expect("findings[*].skill", "contains", "tensor-operations-and-memory"),
            Expect("top_activation_modules[0].type", "ne", ""),
            Expect("peak_phase", "ne", "optimizer_step"),
        ],
    ),
    Scenario(
        id="checkpointing-the-block-cuts-activations",
        tool="estimate_memory",
        description="The same model with activation_checkpointing=['Block'] saves far fewer activations.",
        arguments={
            "model": f"{M}:deep_blocks",
            "inputs": f"{M}:deep_inputs",
            "activation_checkpointing": ["Block"],
        },
        expect=[Expect("activation_bytes", "le", 40 * 2**20)],
    ),
    Scenario(
        id="optimizer-state-on-eight-ddp-ranks-suggests-sharding",
        tool="estimate_memory",
        description="State-heavy model on 8 DDP ranks: the finding proposes ZeRO/FSDP from the distributed skill.",
        arguments={"model": f"{M}:wide_stack", "input_shape": [4, 2048], "world_size": 8, "sharding": "ddp"},
        expect=[
            Expect("findings[*].code", "contains", "shard_optimizer_state"),
            Expect("findings[*].skill", "contains", "distributed-training-strategies"),
        ],
    ),
    Scenario(
        id="fsdp-gives-per-rank-figures",
        tool="estimate_memory",
        description="FSDP over 4 ranks: per-rank peak below the single-device one, which is reported too.",
        arguments={"model": f"{M}:wide_stack", "input_shape": [4, 2048], "world_size": 4, "sharding": "fsdp"},
        expect=[
            Expect("single_device_peak_allocated_bytes", "not_null"),
            Expect("breakdown.optimizer_state", "le", 40 * 2**20),
            Expect("sharding", "eq", "fsdp"),
        ],
    ),
    Scenario(
        id="does-not-fit-reports-the-largest-batch",
        slow=True,  # over 2 s: the README's quick set stays near 5 minutes
        tool="estimate_memory",
        description="1 GiB is not enough for batch 64 of the deep model; the error finding and the max batch size say so.",
        arguments={
            "model": f"{M}:deep_blocks",
            "inputs": f"{M}:deep_inputs",
            "batch_size": 64,
            "device_memory_gib": 1,
        },
        expect=[
            Expect("fits", "eq", False),
            Expect("findings[*].code", "contains", "does_not_fit"),
            Expect("max_batch_size", "between", [1, 63]),
        ],
    ),
    Scenario(
        id="data-dependent-forward-is-extrapolated",
        tool="estimate_memory",
        description="A forward that calls .item() cannot be traced: real runs at batch 2 and 3 are extrapolated.",
        arguments={"model": f"{M}:reads_back", "input_shape": [64, 256], "target_device": "cpu"},
        expect=[
            Expect("method", "eq", "extrapolated"),
            Expect("findings[*].code", "contains", "trace_failed_extrapolated"),
        ],
    ),
    Scenario(
        id="inference-peaks-in-forward",
        tool="estimate_memory",
        description="Inference keeps no gradients, optimizer state or saved activations.",
        arguments={"model": f"{M}:deep_blocks", "inputs": f"{M}:deep_inputs", "mode": "inference"},
        expect=[
            Expect("peak_phase", "eq", "forward"),
            Expect("breakdown.gradients", "eq", 0),
            Expect("breakdown.activations", "eq", 0),
        ],
    ),
    Scenario(
        id="unknown-checkpoint-class-is-an-error",
        tool="estimate_memory",
        description="Checkpointing a class the model does not have fails with the classes it does have.",
        arguments={
            "model": f"{M}:deep_blocks",
            "inputs": f"{M}:deep_inputs",
            "activation_checkpointing": ["TransformerBlock"],
        },
        expect_error="activation_checkpointing names TransformerBlock",
    ),
]
