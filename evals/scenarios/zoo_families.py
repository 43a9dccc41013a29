"""The zoo's other families (issue 26): diffusion, PEFT, MoE, SSM, GNN, RNN and audio-conv models.

Per family, on the healthy model:
- check_gradients raises no warning or error (zeros that are there by design, such as Wav2Vec2's
  LayerDrop skipping a layer, are recognised as info);
- estimate_memory's peak is within the family's tolerance of the CPU peak of three real AdamW steps,
  measured with torch_skills.memory.groundtruth (`python evals/models/zoo_truth.py` prints the
  figures pasted below; `error` records today's relative error of the estimate);
- profile_model runs with the thread count it was given, and where an analytic count is easy
  (LSTM, GRU, Mixtral's routed experts) counts FLOPs within 10% of it;
- verify_checkpoint judges a saved state dict right and loads and runs it.
Seeded bugs: a double softmax before cross_entropy, CTC targets longer than the audio's frames.
Models and batches: evals/models/zoo_families.py; every family is skipped with a reason without its
package. Calls that take over about 2 s on a loaded 2-core machine are slow (see `quick`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from evals.framework import Expect, Scenario
from evals.models.zoo_families import CHECKPOINTS, mixtral_flops, rnn_flops, write_checkpoint

Z = "evals/models/zoo_families.py"
CKPT = str(CHECKPOINTS.relative_to(CHECKPOINTS.parents[3]))  # evals/models/zoo_checkpoints/families
HF = ("transformers",)
DIFFUSERS = ("diffusers",)
PEFT = ("transformers", "peft")
PYG = ("torch_geometric",)
GOAL = 0.02  # issue 26: the estimate within 2% of the measured peak


@dataclass(frozen=True)
class Family:
    inputs: str
    requires: tuple[str, ...]
    measured_peak: int  # bytes: CPU-allocator peak of three real AdamW steps (zoo_truth.py)
    error: float  # today's (estimate - measured) / measured, for the record
    tolerance: float = GOAL  # what the scenario asserts; above GOAL only where today's error is
    quick: tuple[str, ...] = ()  # tools whose call stays under ~2 s; the others run under -m slow
    analytic_flops: int | None = None  # forward+backward matmul FLOPs per step, when easy


FAMILIES: dict[str, Family] = {
    "unet": Family("unet_batch", DIFFUSERS, 20_506_068, -0.0004),
    "vae": Family("vae_batch", DIFFUSERS, 10_298_564, +0.0021),
    "qwen2_lora": Family("lm_batch", PEFT, 654_280, -0.0000),
    # traced on fake tensors fails (grouped_mm wants bf16 there); the fallback measures real steps
    "mixtral": Family(
        "lm_batch", HF, 4_373_220, -0.0000, quick=("check_gradients",), analytic_flops=mixtral_flops()
    ),
    # was +4.9% while the engine's gradient sums under the ledger were out of place (ledger docstring)
    "mamba": Family("lm_batch", HF, 2_503_520, +0.0000),
    # fallback (PyG's edge masks are data-dependent): one real step at graph_batch()'s own 64 nodes
    "gat": Family("graph_batch", PYG, 220_036, -0.0003),
    "lstm_seq2seq": Family("translation_batch", (), 7_339_664, -0.0001, analytic_flops=rnn_flops(4)),
    "gru_seq2seq": Family(
        "translation_batch", (), 4_187_736, +0.0000, quick=("check_gradients",), analytic_flops=rnn_flops(3)
    ),
    # labels.max() in the CTC head stops the trace; the fallback measures real steps
    "wav2vec2": Family("ctc_batch", HF, 7_487_194, -0.0002),
}

NO_ALARM = [
    Expect("findings[*].severity", "not_contains", "warning"),
    Expect("findings[*].severity", "not_contains", "error"),
]


def _args(model: str, inputs: str, **extra) -> dict:
    return {"model": f"{Z}:{model}", "inputs": f"{Z}:{inputs}", "device": "cpu", **extra}


SCENARIOS: list[Scenario] = []
for model, f in FAMILIES.items():
    flops = (
        [Expect("flops_per_step", "approx", f.analytic_flops, tolerance=0.10)]
        if f.analytic_flops
        else [Expect("flops_per_step", "ge", 1)]
    )
    SCENARIOS += [
        Scenario(
            id=f"zoo-{model}-gradients-healthy",
            tool="check_gradients",
            arguments=_args(model, f.inputs),
            expect=[*NO_ALARM, Expect("nonfinite", "is_null")],
            description=f"{model} from a config: a healthy model has no gradient warning",
            slow="check_gradients" not in f.quick,
            requires=f.requires,
        ),
        Scenario(
            id=f"zoo-{model}-memory-vs-measured",
            tool="estimate_memory",
            # the truth was measured on 1 thread (zoo_truth.py); oneDNN's conv scratch is per thread
            arguments=_args(model, f.inputs, target_device="cpu", cpu_threads=1),
            expect=[Expect("peak_allocated_bytes", "approx", f.measured_peak, tolerance=f.tolerance)],
            description=f"{model}: the estimate within {f.tolerance:.0%} of the measured CPU peak "
            f"({f.measured_peak:,} B; {f.error:+.2%} when recorded)",
            slow="estimate_memory" not in f.quick,
            requires=f.requires,
        ),
        Scenario(
            id=f"zoo-{model}-profile-flops",
            tool="profile_model",
            arguments=_args(model, f.inputs, warmup_steps=1, active_steps=3, cpu_threads=1),
            expect=[
                *flops,
                Expect("cpu_threads", "eq", 1),
                Expect("findings[*].code", "not_contains", "probe_failed"),
            ],
            description=f"{model}: profiled on 1 thread; FLOPs "
            + ("within 10% of the analytic count" if f.analytic_flops else "counted"),
            slow=True,
            requires=f.requires,
        ),
    ]

CHECKPOINT_RUNS = {  # factory -> (inputs, packages, slow)
    "lstm_seq2seq": ("translation_batch", (), False),
    "gat": ("graph_batch", PYG, True),  # importing torch_geometric costs ~5 s
    "mixtral": ("lm_batch", HF, False),
    "mamba": ("lm_batch", HF, True),
    "wav2vec2": ("ctc_batch", HF, True),
    "vae": ("vae_batch", DIFFUSERS, True),
    "unet": ("unet_batch", DIFFUSERS, True),
}
for model, (inputs, requires, slow) in CHECKPOINT_RUNS.items():
    SCENARIOS.append(
        Scenario(
            id=f"zoo-{model}-state-dict-fits-and-runs",
            tool="verify_checkpoint",
            arguments={
                "path": f"{CKPT}/{model}.pt",
                "model": f"{Z}:{model}",
                "inputs": f"{Z}:{inputs}",
                "load_and_run": True,
            },
            expect=[
                Expect("key_mismatch.fits", "eq", True),
                Expect("load_and_run.forward_ran", "eq", True),
                Expect("load_and_run.output_finite", "eq", True),
                *NO_ALARM,
            ],
            description=f"{model}'s torch.save(state_dict()) fits its model, loads strictly and runs",
            slow=slow,
            requires=requires,
            prepare=partial(write_checkpoint, model),
        )
    )

SCENARIOS += [
    Scenario(
        id="zoo-qwen2-lora-adapter-folder-fits-the-base-model",
        tool="verify_checkpoint",
        arguments={"path": f"{CKPT}/qwen2_lora", "model": f"{Z}:qwen2"},
        expect=[Expect("layout", "eq", "peft_adapter"), Expect("adapter.fits", "eq", True), *NO_ALARM],
        description="a PEFT save_pretrained folder (8 LoRA tensors) is checked against base model + "
        "adapter as PeftModel.from_pretrained loads it, not as 27 missing keys",
        slow=True,
        requires=PEFT,
        prepare=partial(write_checkpoint, "qwen2_lora"),
    ),
    Scenario(
        id="zoo-lstm-seq2seq-sparse-embeddings-are-by-design",
        tool="check_gradients",
        arguments=_args("lstm_seq2seq_sparse", "padded_translation_batch"),
        expect=[*NO_ALARM, Expect("findings[*].code", "not_contains", "vanishing_gradients")],
        description="nn.Embedding(sparse=True): rows no token used get no gradient, which is not vanishing",
        slow=True,
    ),
    Scenario(
        id="zoo-wav2vec2-layerdrop-is-by-design",
        tool="check_gradients",
        arguments=_args("wav2vec2_layerdrop", "ctc_batch"),
        expect=[*NO_ALARM, Expect("findings[*].code", "contains", "by_design_zeros")],
        description="LayerDrop 0.1 skips encoder layer 0 at the tool's seed: said to be by design, "
        "not a branch never taken",
        slow=True,
        requires=HF,
    ),
    Scenario(
        id="zoo-wav2vec2-layerdrop-memory-is-the-all-layers-peak",
        tool="estimate_memory",
        arguments=_args("wav2vec2_layerdrop", "ctc_batch", target_device="cpu", cpu_threads=1),
        expect=[Expect("peak_allocated_bytes", "approx", FAMILIES["wav2vec2"].measured_peak, tolerance=GOAL)],
        description="a step that runs every layer is LayerDrop's worst case, the peak to plan for "
        "(measured: the same as without LayerDrop)",
        slow=True,
        requires=HF,
    ),
    Scenario(
        id="zoo-lstm-seq2seq-double-softmax-found",
        tool="check_gradients",
        arguments=_args("lstm_seq2seq_double_softmax", "translation_batch"),
        expect=[
            Expect("findings[*].code", "contains", "loss_on_probabilities"),
            Expect("loss_inputs[0].problem", "eq", "double_softmax"),
            Expect("loss_inputs[0].chain", "contains", "SoftmaxBackward0"),
        ],
        description="the decoder returns softmax probabilities and cross_entropy softmaxes them again",
        slow=True,
    ),
    Scenario(
        id="zoo-wav2vec2-infeasible-ctc-target-found",
        tool="check_gradients",
        arguments=_args("wav2vec2", "ctc_infeasible_batch"),
        expect=[
            Expect("findings[*].code", "contains", "nonfinite_forward"),
            Expect("nonfinite.op", "eq", "ctc_loss"),
            Expect("nonfinite.kind", "eq", "inf"),
            Expect("nonfinite.cause", "contains", "target length 400"),
        ],
        description="400-token transcripts for 199 frames: the CTC loss is inf, and the cause names the lengths",
        slow=True,
        requires=HF,
    ),
]
