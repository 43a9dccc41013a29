"""Scripted scenarios for profile_model: steps bound by a known resource, and exact FLOP counts.

Each model in evals/models/profile_model_scenarios.py is built so one resource dominates by a wide
margin (a loader sleeping 0.1 s per batch, 2000+ dispatches on (4, 16) tensors, one 1 GFLOP
matmul, elementwise ops streaming 4 MiB tensors), so the verdict holds on a busy machine too. The
scenarios whose ops torch may split across threads (matmuls, large elementwise ops) run with
cpu_threads=1: on an oversubscribed machine two intra-op threads stall each other for whole
scheduler slices (a 0.4 ms step measured at 60 ms), which no ratio survives; the tool reports that
as cpu_contention. The tiny-ops scenario keeps torch's default threads: ops that small never split.
FLOP counts are the arithmetic for Linear layers: 2*B*in*out per forward, and in training 2x more
for the weight and input gradients (the first layer has no input gradient: its input needs none).
"""

from __future__ import annotations

from evals.framework import Expect, Scenario

MODELS = "evals/models/profile_model_scenarios.py"
B, IN, HIDDEN, OUT = 32, 64, 128, 10  # flops_mlp: Linear(64, 128) -> ReLU -> Linear(128, 10)
FORWARD_FLOPS = 2 * B * IN * HIDDEN + 2 * B * HIDDEN * OUT  # 606_208
TRAIN_FLOPS = 4 * B * IN * HIDDEN + 6 * B * HIDDEN * OUT  # 1_294_336
# lstm_tagger: LSTM(32, 64, 2 layers) on (4, 16, 32), then Linear(64, 5) per step; 4 gates per step and layer
SEQ_B, SEQ_T, SEQ_IN, SEQ_H, SEQ_OUT = 4, 16, 32, 64, 5
LSTM_FORWARD_FLOPS = 2 * SEQ_B * SEQ_T * ((SEQ_IN + SEQ_H) + (SEQ_H + SEQ_H)) * 4 * SEQ_H  # 7_340_032
TAGGER_FORWARD_FLOPS = LSTM_FORWARD_FLOPS + 2 * SEQ_B * SEQ_T * SEQ_H * SEQ_OUT
# grouped_moe: 64 tokens of width 64, router to 4 experts, top-2 SwiGLU experts of width 128 (3 matmuls each)
MOE_N, MOE_D, MOE_F, MOE_E, MOE_K = 64, 64, 128, 4, 2
MOE_FORWARD_FLOPS = 2 * MOE_N * MOE_D * MOE_E + 2 * MOE_N * MOE_K * 3 * MOE_D * MOE_F  # 6_324_224

SCENARIOS: list[Scenario] = [
    Scenario(
        id="profile-data-bound-sleepy-loader",
        slow=True,  # over 2 s: the README's quick set stays near 5 minutes
        tool="profile_model",
        description="a loader that sleeps 0.1 s per batch in front of a small MLP",
        arguments={
            "model": f"{MODELS}:small_mlp",
            "data": f"{MODELS}:sleepy_loader",
            "warmup_steps": 1,
            "active_steps": 4,
            "cpu_threads": 1,
        },
        expect=[
            Expect("bottleneck", "eq", "data_loading"),
            Expect("data_wait_share", "ge", 0.5),
            Expect("samples_per_step", "eq", 32),
            Expect("findings[0].code", "eq", "data_bound"),
            Expect("findings[0].skill", "eq", "performance-profiling"),
        ],
    ),
    Scenario(
        id="profile-overhead-bound-tiny-ops",
        slow=True,  # over 2 s: the README's quick set stays near 5 minutes
        tool="profile_model",
        description="120 layers of elementwise ops on a (4, 16) tensor, trained with AdamW",
        arguments={"model": f"{MODELS}:tiny_ops", "input_shape": [4, 16]},
        expect=[
            Expect("bottleneck", "eq", "cpu_overhead"),
            Expect("ops_per_step", "ge", 500),
            Expect("shares.host_overhead", "ge", 0.5),
            Expect("findings[0].code", "eq", "overhead_bound"),
            Expect("findings[0].skill", "eq", "performance-profiling"),
        ],
    ),
    Scenario(
        id="profile-compute-bound-large-matmul",
        slow=True,  # over 2 s: the README's quick set stays near 5 minutes
        tool="profile_model",
        description="one (512, 1024) @ (1024, 1024) matmul per inference step",
        arguments={
            "model": f"{MODELS}:big_matmul",
            "input_shape": [512, 1024],
            "mode": "inference",
            "cpu_threads": 1,
        },
        expect=[
            Expect("bottleneck", "eq", "compute"),
            Expect("flops_per_step", "eq", 2 * 512 * 1024 * 1024),
            Expect("top_ops[0].category", "eq", "matmul"),
            Expect("findings[0].code", "eq", "compute_bound"),
            Expect("findings[0].skill", "eq", "mixed-precision-and-optimization"),
        ],
    ),
    Scenario(
        id="profile-memory-bound-elementwise",
        slow=True,  # over 2 s: the README's quick set stays near 5 minutes
        tool="profile_model",
        description="16 cheap elementwise ops streaming a 4 MiB tensor, inference",
        arguments={
            "model": f"{MODELS}:elementwise",
            "input_shape": [64, 16384],
            "mode": "inference",
            "cpu_threads": 1,
        },
        expect=[
            Expect("bottleneck", "eq", "memory_bandwidth"),
            Expect("flops_per_step", "eq", 0),
            Expect("op_categories[0].category", "eq", "elementwise"),
            Expect("findings[0].code", "eq", "memory_bound"),
            Expect("findings[0].skill", "eq", "tensor-operations-and-memory"),
        ],
    ),
    Scenario(
        id="profile-host-sync-every-layer",
        slow=True,  # over 2 s: the README's quick set stays near 5 minutes
        tool="profile_model",
        description="8 small blocks that each call .item() on their activations",
        arguments={"model": f"{MODELS}:sync_every_layer", "input_shape": [16, 32], "cpu_threads": 1},
        expect=[
            Expect("host_syncs_per_step", "eq", 8),
            Expect("host_syncs[*].module", "contains", "blocks.0"),
            Expect("host_syncs[*].module", "contains", "blocks.7"),
            Expect("host_syncs[*].phase", "not_contains", "optimizer"),
            Expect("host_syncs[0].location", "not_null"),
            Expect("modules[7].name", "eq", "blocks.7"),
            Expect("findings[*].code", "contains", "host_sync"),
            Expect("bottleneck", "eq", "cpu_overhead"),
        ],
    ),
    Scenario(
        id="profile-host-sync-tolist",
        tool="profile_model",
        description="a layer that logs its activations with .tolist() every call",
        arguments={"model": f"{MODELS}:value_logger", "input_shape": [8, 16], "mode": "inference"},
        expect=[
            Expect("host_syncs[*].op", "contains", "Tensor.tolist()"),
            Expect("host_syncs_per_step", "eq", 1),
            Expect("findings[*].code", "contains", "host_sync"),
        ],
    ),
    Scenario(
        id="profile-flops-exact-inference",
        tool="profile_model",
        description="FLOPs of Linear(64,128)-ReLU-Linear(128,10) on a batch of 32, forward only",
        arguments={"model": f"{MODELS}:flops_mlp", "input_shape": [B, IN], "mode": "inference"},
        expect=[
            Expect("flops_per_step", "eq", FORWARD_FLOPS),
            Expect("modules[0].flops_per_step", "eq", 2 * B * IN * HIDDEN),
            Expect("modules[2].flops_per_step", "eq", 2 * B * HIDDEN * OUT),
            Expect("modules[*].name", "contains", "1"),
        ],
    ),
    Scenario(
        id="profile-flops-exact-train",
        slow=True,  # over 2 s: the README's quick set stays near 5 minutes
        tool="profile_model",
        description="the same MLP trained: forward, input and weight gradients",
        arguments={"model": f"{MODELS}:flops_mlp", "input_shape": [B, IN]},
        expect=[
            Expect("flops_per_step", "eq", TRAIN_FLOPS),
            Expect("samples_per_step", "eq", B),
            Expect("phases[*].phase", "contains", "backward"),
            Expect("phases[*].phase", "contains", "optimizer"),
        ],
    ),
    Scenario(
        id="profile-flops-fused-lstm",
        slow=True,  # over 2 s: the README's quick set stays near 5 minutes
        tool="profile_model",
        description="a 2-layer LSTM tagger, forward only: the fused LSTM's gate matmuls are counted",
        arguments={
            "model": f"{MODELS}:lstm_tagger",
            "input_shape": [SEQ_B, SEQ_T, SEQ_IN],
            "mode": "inference",
            "cpu_threads": 1,
        },
        expect=[
            Expect("flops_per_step", "eq", TAGGER_FORWARD_FLOPS),
            Expect("modules[0].flops_per_step", "eq", LSTM_FORWARD_FLOPS),
            Expect("device_name", "contains", "(1 thread)"),
        ],
    ),
    Scenario(
        id="profile-flops-grouped-mm-moe",
        tool="profile_model",
        description="a top-2-of-4 MoE whose experts run as grouped matmuls on the routed tokens",
        arguments={
            "model": f"{MODELS}:grouped_moe",
            "input_shape": [MOE_N, MOE_D],
            "mode": "inference",
            "cpu_threads": 1,
        },
        expect=[Expect("flops_per_step", "eq", MOE_FORWARD_FLOPS)],
    ),
    Scenario(
        id="profile-loader-not-iterable",
        tool="profile_model",
        arguments={"model": f"{MODELS}:small_mlp", "data": f"{MODELS}:not_a_loader"},
        expect_error="not iterable",
    ),
    Scenario(
        id="profile-trace-outside-roots",
        tool="profile_model",
        arguments={"model": f"{MODELS}:small_mlp", "input_shape": [4, 64], "trace_path": "/etc/step.json"},
        expect_error="outside the allowed roots",
    ),
    Scenario(
        id="profile-compile-speedup",
        tool="profile_model",
        description="torch.compile on a small MLP: compile time and speed-up are reported",
        arguments={
            "model": f"{MODELS}:small_mlp",
            "input_shape": [32, 64],
            "compile": True,
            "active_steps": 5,
            "cpu_threads": 1,
        },
        expect=[
            Expect("compile.status", "eq", "ok"),
            Expect("compile.compile_time_s", "ge", 0.05),
            Expect("compile.speedup", "not_null"),
        ],
        slow=True,
    ),
]
