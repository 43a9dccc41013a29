"""The model's side of a key comparison: its keys, which share storage, and its library's renames.

Use it in the worker before `compare_state_dicts`:

    keys = model_keys(model)
    report = compare_state_dicts(ckpt_entries, keys.entries, tied=keys.tied, library=keys.library)

- `entries`: state-dict key -> (shape, dtype name), tensors only (extra state is skipped).
- `tied`: key -> the first key holding the same storage. A checkpoint may carry one key of a
  tied group (GPT-2 `lm_head.weight` = `transformer.wte.weight`, T5's shared embeddings,
  nanoGPT's `wte`/`lm_head`): safetensors and `save_pretrained` drop the duplicates, and loading
  one key fills every tensor of the group, since they are one tensor.
- `library`: for a Hugging Face `PreTrainedModel`, the checkpoint-key rename `from_pretrained`
  applies (the model's registered WeightRenamings, legacy gamma/beta -> weight/bias, and adding or
  stripping `base_model_prefix`), taken from transformers itself so it follows the installed
  version. None for other models.

For a PEFT adapter (checkpoint.adapter): `layer_shapes(model)` and `base_entries(model)` describe the
base model an adapter goes on, by the bare base's names, also when the factory returns a PeftModel
(get_peft_model's result) or a model with LoRA already injected.

Known limitations: transformers' WeightConverters (several checkpoint tensors merged or split into
one parameter) are not applied; their keys show as missing/unexpected pairs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from torch_skills.checkpoint.adapter import LayerShape
from torch_skills.checkpoint.fit import Entry, LibraryRename


@dataclass
class ModelKeys:
    entries: dict[str, Entry]
    tied: dict[str, str] = field(default_factory=dict)
    library: LibraryRename | None = None


def model_keys(model: torch.nn.Module) -> ModelKeys:
    state = model.state_dict(keep_vars=True)
    entries: dict[str, Entry] = {}
    first_of: dict[tuple, str] = {}
    tied: dict[str, str] = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue  # extra state (get_extra_state) is not a tensor
        entries[key] = (tuple(value.shape), str(value.dtype).removeprefix("torch."))
        if value.device.type == "meta" or value.numel() == 0:
            continue
        identity = (
            value.untyped_storage().data_ptr(),
            value.storage_offset(),
            tuple(value.shape),
            value.stride(),
        )
        if identity in first_of:
            tied[key] = first_of[identity]
        else:
            first_of[identity] = key
    return ModelKeys(entries, tied, _transformers_rename(model, entries))


def _is_transformers_model(model: torch.nn.Module) -> bool:
    return any(
        c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.")
        for c in type(model).__mro__
    )


def _transformers_rename(model: torch.nn.Module, entries: dict[str, Entry]) -> LibraryRename | None:
    if not _is_transformers_model(model):
        return None
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:  # an older transformers: only the prefix rule, which it has always applied
        return _prefix_only(getattr(model, "base_model_prefix", "") or "", entries)
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    prefix = getattr(model, "base_model_prefix", None) or None

    def rename(key: str) -> str:
        return rename_source_key(key, renamings, converters, prefix, entries)[0]

    return LibraryRename("transformers from_pretrained key renames", rename)


def _prefix_only(prefix: str, entries: dict[str, Entry]) -> LibraryRename | None:
    if not prefix:
        return None
    head = prefix + "."

    def rename(key: str) -> str:
        if key.startswith(head) and key[len(head) :] in entries:
            return key[len(head) :]
        if head + key in entries:
            return head + key
        return key

    return LibraryRename(f"transformers base_model_prefix '{prefix}'", rename)


RenameFn = Callable[[str], str]


_PEFT_PARTS = frozenset(
    "lora_A lora_B lora_embedding_A lora_embedding_B lora_magnitude_vector lora_dropout modules_to_save".split()
)
_PEFT_WRAPPERS = frozenset({"base_layer", "original_module"})


def is_peft_model(model: torch.nn.Module) -> bool:
    """A peft PeftModel (what get_peft_model returns): its base model sits under base_model.model."""
    return any(c.__module__.startswith("peft.") and c.__name__ == "PeftModel" for c in type(model).__mro__)


def adapter_base(model: torch.nn.Module) -> torch.nn.Module:
    """The base model an adapter goes on: `model`, or the one inside a PeftModel."""
    return model.get_base_model() if is_peft_model(model) else model


def _as_base(name: str) -> str | None:
    """A module or key name of a LoRA-injected model as the bare base names it; None for PEFT's own parts."""
    parts = name.split(".")
    if any(p in _PEFT_PARTS for p in parts):
        return None
    return ".".join(p for p in parts if p not in _PEFT_WRAPPERS)


def base_entries(model: torch.nn.Module) -> dict[str, Entry]:
    """adapter_base(model)'s state-dict entries under the bare base model's names (LoRA parts dropped)."""
    out = {}
    for key, entry in model_keys(adapter_base(model)).entries.items():
        name = _as_base(key)
        if name is not None:
            out.setdefault(name, entry)
    return out


def layer_shapes(model: torch.nn.Module) -> dict[str, LayerShape]:
    """Every named module of the base model with the sizes LoRA builds its matrices from (see
    checkpoint.adapter); a PeftModel or LoRA-injected module is described as its bare base layer."""
    out: dict[str, LayerShape] = {}
    for raw, module in adapter_base(model).named_modules():
        name = _as_base(raw)
        if not name or name in out:
            continue
        if hasattr(module, "get_base_layer"):  # a peft tuner layer: describe what it wraps
            module = module.get_base_layer()
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear):
            out[name] = LayerShape("linear", module.in_features, module.out_features)
        elif isinstance(module, torch.nn.Embedding):
            out[name] = LayerShape("embedding", module.num_embeddings, module.embedding_dim)
        elif isinstance(module, torch.nn.modules.conv._ConvNd):
            out[name] = LayerShape("conv", module.in_channels, module.out_channels, tuple(module.kernel_size))
        elif type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
            out[name] = LayerShape(
                "linear", weight.shape[0], weight.shape[1]
            )  # transformers' GPT-2 (in, out)
        else:
            out[name] = LayerShape("other")
    return out
