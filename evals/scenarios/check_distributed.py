"""Eval scenarios for check_distributed: one per finding kind, a healthy model, FSDP2, a failing rank.

The models in evals/models/distributed_models.py and distributed_hf.py were written apart from the
tool's tests (tests/fixtures/distributed_zoo.py): Hugging Face GPT-2 and BERT from configs, a
torchvision-style ResNet, a top-1 mixture of experts. Paths are relative to the repository root,
the server's working directory in evals. Each call forks two gloo ranks; the quick set keeps the
two that need no third-party import.
"""

from __future__ import annotations

from evals.framework import Expect, Scenario

M = "evals/models/distributed_models.py"
H = "evals/models/distributed_hf.py"
ZOO = "tests/fixtures/distributed_zoo.py"
HF = ("transformers",)

SCENARIOS: list[Scenario] = [
    Scenario(
        id="healthy-resnet-has-no-findings",
        tool="check_distributed",
        arguments={"model": f"{M}:resnet", "inputs": f"{M}:image_batch"},
        expect=[
            Expect("findings", "eq", []),
            Expect("steps_completed", "eq", 3),
            Expect("gradient_check.ratio_median", "approx", 1.0, tolerance=1e-4),
            Expect("notes[0]", "contains", "SyncBatchNorm"),
        ],
        description="BatchNorm ResNet under DDP: identical replicas, one-process gradient, BatchNorm explained",
    ),
    Scenario(
        id="moe-experts-without-tokens-are-data-dependent-unused",
        slow=True,  # over 2 s: the README's quick set stays near 5 minutes
        tool="check_distributed",
        arguments={"model": f"{M}:moe", "inputs": f"{M}:skewed_tokens"},
        expect=[
            Expect("findings[*].code", "contains", "data_dependent_unused"),
            Expect("findings[*].kind", "not_contains", "rank_failure"),
            Expect("steps_completed", "eq", 3),
        ],
        description="top-1 routing: an expert with no tokens on one rank gets no gradient there",
    ),
    Scenario(
        id="bert-pooler-is-always-unused",
        tool="check_distributed",
        arguments={
            "model": f"{H}:bert_encoder",
            "inputs": f"{H}:ids_batch",
            "loss": f"{H}:token_states_loss",
        },
        expect=[
            Expect("findings[0].kind", "eq", "unused_parameters"),
            Expect("findings[0].code", "eq", "always_unused"),
            Expect("findings[0].names", "eq", ["pooler.dense.bias", "pooler.dense.weight"]),
        ],
        description="the Hugging Face pooler DDP complains about: built, run, never in the loss",
        slow=True,
        requires=HF,
    ),
    Scenario(
        id="rank-zero-accuracy-all-reduce-is-a-collective-mismatch",
        tool="check_distributed",
        arguments={
            "model": f"{M}:resnet",
            "inputs": f"{M}:image_batch",
            "loss": f"{M}:accuracy_logging_loss",
            "hang_timeout_s": 5,
        },
        expect=[
            Expect("findings[0].kind", "eq", "collective_mismatch"),
            Expect("findings[0].calls[0].op", "eq", "all_reduce"),
            Expect("findings[0].calls[0].shapes", "eq", [[1]]),
            Expect("findings[0].calls[1].where", "eq", "DDP gradient bucket 0"),
        ],
        description="an accuracy all-reduced only on the logging rank meets DDP's bucket on the other",
        slow=True,
    ),
    Scenario(
        id="fsdp2-batchnorm-running-stats-diverge",
        tool="check_distributed",
        arguments={"model": f"{M}:resnet", "inputs": f"{M}:image_batch", "strategy": "fsdp"},
        expect=[
            Expect("findings[0].kind", "eq", "replica_divergence"),
            Expect("findings[0].names", "contains", "stem.1.running_mean"),
            Expect("findings[0].message", "contains", "FSDP does not broadcast buffers"),
        ],
        description="FSDP2 never syncs buffers: each rank's BatchNorm statistics drift apart",
        slow=True,
    ),
    Scenario(
        id="gpt2-token-sum-loss-is-a-world-size-gradient-factor",
        tool="check_distributed",
        arguments={"model": f"{H}:gpt2", "inputs": f"{H}:lm_batch", "loss": f"{H}:token_sum_loss"},
        expect=[
            Expect("findings[0].code", "eq", "summed_loss"),
            Expect("gradient_check.ratio_median", "approx", 2.0, tolerance=1e-3),
        ],
        slow=True,
        requires=HF,
    ),
    Scenario(
        id="gpt2-shuffled-loader-without-distributed-sampler",
        tool="check_distributed",
        arguments={"model": f"{H}:gpt2", "data": f"{H}:lm_loader"},
        expect=[
            Expect("findings[0].code", "eq", "no_distributed_sampler"),
            Expect("data.overlap", "eq", 1.0),
            Expect("data.sampler", "eq", "RandomSampler"),
        ],
        description="shuffle=True with the same seed on every rank: the same samples everywhere",
        slow=True,
        requires=HF,
    ),
    Scenario(
        id="gpt2-fsdp2-is-healthy",
        tool="check_distributed",
        arguments={"model": f"{H}:gpt2", "inputs": f"{H}:lm_batch", "strategy": "fsdp"},
        expect=[
            Expect("findings", "eq", []),
            Expect("ranks[0].steps[0].collectives.reduce_scatter.count", "eq", 3),
            Expect("gradient_check.max_relative_difference", "le", 1e-3),
        ],
        description="fully_shard on each transformer block and the root: no finding, 3 reduce-scatters a step",
        slow=True,
        requires=HF,
    ),
    Scenario(
        id="hand-split-shards-give-unequal-batch-counts",
        tool="check_distributed",
        arguments={"model": f"{ZOO}:healthy_mlp", "data": f"{ZOO}:loader_uneven"},
        expect=[
            Expect("findings[0].code", "eq", "unequal_batches"),
            Expect("data.batches_per_rank", "eq", [5, 3]),
        ],
        slow=True,
    ),
    Scenario(
        id="a-segfaulting-rank-is-named-and-the-call-returns",
        tool="check_distributed",
        arguments={
            "model": f"{ZOO}:fail_on_rank",
            "model_kwargs": {"how": "segfault"},
            "input_shape": [8, 16],
            "hang_timeout_s": 5,
        },
        expect=[
            Expect("findings[0].kind", "eq", "rank_failure"),
            Expect("findings[0].code", "eq", "rank_crashed"),
            Expect("findings[0].ranks", "eq", [1]),
        ],
        slow=True,
    ),
]
