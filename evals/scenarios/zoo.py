"""The real-model zoo: all four tools on transformers models built from configs, healthy and broken.

Healthy models must raise no warning or error finding (the figures of a healthy model are not a
diagnosis); each broken copy carries one seeded bug the tool must name. The Hugging Face
scenarios need the `[zoo]` extra and are skipped with that reason without it; the heavier ones are
marked slow (profile_model times many steps; BERT, T5, Llama and ConvNeXt double the coverage of
GPT-2 and ViT). Models and batches: evals/models/zoo.py.
"""

from __future__ import annotations

from evals.framework import Expect, Scenario
from evals.models.zoo import CHECKPOINTS, write_checkpoints

Z = "evals/models/zoo.py"
HF = ("transformers",)
CKPT = str(CHECKPOINTS.relative_to(CHECKPOINTS.parents[2]))  # evals/models/zoo_checkpoints

# (factory, inputs, the batch rule the tools must apply, where the loss must come from, slow)
HEALTHY = [
    ("gpt2", "lm_batch", "dict", "output.loss", False, HF),
    ("vit", "image_batch", "dict", "output.loss", False, HF),
    ("tiny_gpt", "token_pair", "positional", "output[1]", False, ()),
    ("bert", "lm_batch", "dict", "output.loss", True, HF),
    ("t5", "seq2seq_batch", "dict", "output.loss", True, HF),
    ("llama", "lm_batch", "dict", "output.loss", True, HF),
    ("convnext", "image_pair", "positional", "output.loss", True, HF),
]

NO_ALARM = [
    Expect("findings[*].severity", "not_contains", "warning"),
    Expect("findings[*].severity", "not_contains", "error"),
]


def _args(model: str, inputs: str, **extra) -> dict:
    return {"model": f"{Z}:{model}", "inputs": f"{Z}:{inputs}", "device": "cpu", **extra}


SCENARIOS: list[Scenario] = []
for model, inputs, kind, loss, slow, requires in HEALTHY:
    rule = [Expect("batch_rule.batch", "eq", kind)]
    SCENARIOS += [
        Scenario(
            id=f"zoo-{model}-gradients-healthy",
            tool="check_gradients",
            arguments=_args(model, inputs),
            expect=[Expect("findings", "eq", []), *rule, Expect("loss.how", "contains", loss)],
            description=f"{model} from a config: a healthy model has no gradient findings",
            slow=slow,
            requires=requires,
        ),
        Scenario(
            id=f"zoo-{model}-memory-traced",
            tool="estimate_memory",
            arguments=_args(model, inputs, target_device="cpu"),
            expect=[Expect("method", "eq", "traced"), *NO_ALARM, *rule],
            description=f"{model}: traced on fake tensors (its constructor included), no false alarm",
            slow=slow,
            requires=requires,
        ),
        Scenario(
            id=f"zoo-{model}-profile-healthy",
            tool="profile_model",
            arguments=_args(model, inputs, warmup_steps=1, active_steps=3),
            expect=[
                *rule,
                Expect("findings[*].code", "not_contains", "host_sync"),
                Expect("findings[*].code", "not_contains", "probe_failed"),
                Expect("findings[*].code", "not_contains", "data_bound"),
            ],
            description=f"{model}: profiled without false alarms (load-dependent timing findings aside)",
            slow=True,
            requires=requires,
        ),
    ]

SCENARIOS += [
    Scenario(
        id="zoo-gpt2-detached-block-found",
        tool="check_gradients",
        arguments=_args("gpt2_detached_block", "lm_batch"),
        expect=[
            Expect("findings[*].code", "contains", "graph_break_detach"),
            Expect("unused_parameters", "contains", "transformer.h.1.attn.c_attn.weight"),
        ],
        description="a detached attention output in block 1: its weights get no gradient, and why",
        requires=HF,
    ),
    Scenario(
        id="zoo-llama-item-in-forward-memory",
        tool="estimate_memory",
        arguments=_args("llama_item_in_forward", "lm_batch", target_device="cpu"),
        expect=[
            Expect("method", "ne", "traced"),
            Expect("findings[*].code", "contains", "trace_failed_extrapolated"),
            Expect("findings[0].message", "contains", "the step"),
        ],
        description=".item() in forward cannot be traced; the fallback names the step, not the constructor",
        requires=HF,
    ),
    Scenario(
        id="zoo-llama-item-in-forward-profile",
        tool="profile_model",
        arguments=_args("llama_item_in_forward", "lm_batch", warmup_steps=1, active_steps=3),
        expect=[Expect("findings[*].code", "contains", "host_sync")],
        description="the per-step .item() is found as a host sync",
        slow=True,
        requires=HF,
    ),
    Scenario(
        id="zoo-gpt2-save-pretrained-fits",
        tool="verify_checkpoint",
        arguments={
            "path": f"{CKPT}/gpt2/model.safetensors",
            "model": f"{Z}:gpt2",
            "inputs": f"{Z}:lm_batch",
            "load_and_run": True,
        },
        expect=[
            Expect("key_mismatch.fits", "eq", True),
            Expect("key_mismatch.tied_missing", "eq", ["lm_head.weight"]),
            Expect("load_and_run.forward_ran", "eq", True),
            *NO_ALARM,
        ],
        description="save_pretrained drops the tied lm_head: not missing, it loads and runs",
        requires=HF,
        prepare=write_checkpoints,
    ),
    Scenario(
        id="zoo-vit-save-pretrained-renamed-keys-fit",
        tool="verify_checkpoint",
        arguments={
            "path": f"{CKPT}/vit/model.safetensors",
            "model": f"{Z}:vit",
            "inputs": f"{Z}:image_batch",
            "load_and_run": True,
        },
        expect=[
            Expect("key_mismatch.fits", "eq", True),
            Expect("key_mismatch.library_renamed", "ge", 1),
            Expect("load_and_run.forward_ran", "eq", True),
            *NO_ALARM,
        ],
        description="transformers renames ViT's keys on load; the fit follows from_pretrained's rules",
        requires=HF,
        prepare=write_checkpoints,
    ),
    Scenario(
        id="zoo-t5-shared-embeddings-fit",
        tool="verify_checkpoint",
        arguments={"path": f"{CKPT}/t5/model.safetensors", "model": f"{Z}:t5"},
        expect=[Expect("key_mismatch.fits", "eq", True), *NO_ALARM],
        description="T5's shared/encoder/decoder embeddings are one tensor saved once",
        slow=True,
        requires=HF,
        prepare=write_checkpoints,
    ),
    Scenario(
        id="zoo-tiny-gpt-tied-torch-save-fits",
        tool="verify_checkpoint",
        arguments={
            "path": f"{CKPT}/tiny_gpt.pt",
            "model": f"{Z}:tiny_gpt",
            "inputs": f"{Z}:token_pair",
            "load_and_run": True,
        },
        expect=[
            Expect("key_mismatch.fits", "eq", True),
            Expect("load_and_run.forward_ran", "eq", True),
            *NO_ALARM,
        ],
        description="nanoGPT-style tying saved with torch.save: fits and runs",
        prepare=write_checkpoints,
    ),
    Scenario(
        id="zoo-vit-nan-weights-found",
        tool="verify_checkpoint",
        arguments={"path": f"{CKPT}/vit_nan/model.safetensors", "model": f"{Z}:vit"},
        expect=[
            Expect("findings[*].code", "contains", "nonfinite_tensors"),
            Expect("key_mismatch.fits", "eq", True),
        ],
        description="a NaN in one attention weight of a save_pretrained folder is found",
        requires=HF,
        prepare=write_checkpoints,
    ),
]
