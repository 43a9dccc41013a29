"""Does a PEFT LoRA adapter fit a base model, as `PeftModel.from_pretrained(base_model, folder)` loads it?

Use (no torch here; the worker describes the base model's layers with modelkeys.layer_shapes):

    check = check_adapter(config, adapter_entries, layers, base_entries, folder="out/adapter")
    check.fits, check.problems, check.loader.call

`peft_model.save_pretrained(folder)` saves only the adapter: for each LoRA-wrapped module `M` of the
base model, `base_model.model.M.lora_A.weight` with shape [r, in_features] and
`base_model.model.M.lora_B.weight` with shape [out_features, r] (Embedding: `lora_embedding_A`
[r, num_embeddings] and `lora_embedding_B` [embedding_dim, r]; ConvNd: lora_A [r, in, *kernel],
lora_B [out, r, 1, ...]), plus the whole tensors of `modules_to_save` under their base names. On
load PEFT wraps every module `target_modules` selects, inserts the adapter name (`default`) into
each key (`lora_A.default.weight`, `lm_head.modules_to_save.default.weight`) and loads the file
with strict=False: a key with no place is dropped, a shape that differs fails the load.

Each problem is reported at its module: weights for a module the base lacks, a rank that is not
the config's `r` (or its `rank_pattern` entry), an input/output size that is not the base layer's
(the adapter was trained on another base model), weights for a module `target_modules` does not
select (dropped), a selected module with no weights (left at PEFT's init: no effect), a saved
tensor whose shape differs from the base's.

Known limitations: LoRA only (other peft_types are reported as not modelled); `layers_to_transform`
/ `layers_pattern` and the `all-linear` shorthand leave the selected-module count undecided;
`target_parameters` (LoRA on bare parameters), quantized base layers and MultiheadAttention are not
modelled and show as unsupported or unrecognised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch_skills.checkpoint.adapter_config import AdapterConfig
from torch_skills.checkpoint.fit import Entry
from torch_skills.checkpoint.models import AdapterCheck, AdapterProblem, AdapterProblemCode, LoaderCall

PEFT_PREFIX = "base_model.model."
LORA_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")
ADAPTER_NAME = "default"  # PeftModel.from_pretrained's adapter_name default


@dataclass(frozen=True)
class LayerShape:
    """What LoRA needs to know of one base-model module."""

    kind: str  # "linear" (nn.Linear, transformers Conv1D), "embedding", "conv", or "other"
    in_features: int = 0  # Embedding: num_embeddings; Conv: in_channels
    out_features: int = 0  # Embedding: embedding_dim; Conv: out_channels
    kernel: tuple[int, ...] = ()  # Conv only


def severity(code: str) -> str:
    """A selected module without weights only does nothing; every other problem loses weights or fails the load."""
    return "warning" if code == "no_adapter_weights" else "error"


def peft_load_call(folder: str) -> str:
    """The exact call that loads an adapter folder onto the base model."""
    return f"from peft import PeftModel\nmodel = PeftModel.from_pretrained(base_model, {folder!r})"


def _split_lora_key(rest: str) -> tuple[str, str, str | None] | None:
    """(module, part, param) of `M.lora_A[.adapter][.weight]`, else None."""
    parts = rest.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] in LORA_PARTS:
            tail = parts[i + 1 :]
            if len(tail) > 2:
                return None
            param = tail[-1] if tail and tail[-1] in ("weight", "bias") else None
            if len(tail) == 2 and param is None:
                return None
            return ".".join(parts[:i]), parts[i], param
    return None


def _rank(config: AdapterConfig, module: str) -> int:
    for pattern, rank in (config.rank_pattern or {}).items():  # PEFT's get_pattern_key rule
        if re.match(rf"(.*\.)?({pattern})$", module):
            return rank
    return config.r


def _in_names(names: list[str] | str | None, module: str) -> bool:
    if not names:
        return False
    if isinstance(names, str):
        return re.fullmatch(names, module) is not None
    return module in names or any(module.endswith(f".{n}") for n in names)


def _saved_module(config: AdapterConfig, module: str) -> bool:
    """True when `module` is (inside) one of modules_to_save: PEFT wraps it whole, never with LoRA."""
    return any(re.match(rf"(^|.*\.){m}($|\..*)", module) for m in config.modules_to_save or [])


def _targeted(config: AdapterConfig, module: str) -> bool | None:
    """Whether PEFT puts a LoRA layer on `module` (its check_target_module_exists); None: not decided here."""
    if _in_names(config.exclude_modules, module) or _saved_module(config, module):
        return False
    if config.target_modules == "all-linear" or config.layers_to_transform is not None:
        return None
    return _in_names(config.target_modules, module)


def _expected(layer: LayerShape, part: str, param: str | None, r: int) -> tuple[int, ...] | None:
    if layer.kind in ("linear", "conv"):
        ones = (1,) * len(layer.kernel)
        return {
            ("lora_A", "weight"): (r, layer.in_features, *layer.kernel),
            ("lora_B", "weight"): (layer.out_features, r, *ones),
            ("lora_B", "bias"): (layer.out_features,),
        }.get((part, param or ""))
    if layer.kind == "embedding":
        return {
            ("lora_embedding_A", None): (r, layer.in_features),
            ("lora_embedding_B", None): (layer.out_features, r),
        }.get((part, param))
    return None


def _shape_code(part: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> AdapterProblemCode:
    if len(shape) != len(expected):
        return "in_features_mismatch" if part.endswith("A") else "out_features_mismatch"
    rank_dim = 0 if part.endswith("A") else 1
    if len(expected) > 1 and shape[rank_dim] != expected[rank_dim]:
        return "rank_mismatch"
    return "in_features_mismatch" if part.endswith("A") else "out_features_mismatch"


def check_adapter(
    config: AdapterConfig,
    entries: dict[str, Entry],
    layers: dict[str, LayerShape],
    base_entries: dict[str, Entry],
    *,
    folder: str,
    max_listed: int = 50,
) -> AdapterCheck:
    """Check the adapter file's tensors against the base model; see the module docstring."""
    loader = LoaderCall(
        loader="peft_from_pretrained", fits_as_is=False, fits=False, call=peft_load_call(folder)
    )
    names = config.target_modules
    if config.peft_type != "LORA":
        return AdapterCheck.not_modelled(config.peft_type, loader)
    problems: list[AdapterProblem] = []
    flagged: set[tuple[str, str]] = set()

    def problem(code, module, key=None, peft_key=None, shape=None, expected=None):
        if (module, code) in flagged:  # one problem per module and cause
            return
        flagged.add((module, code))
        problems.append(
            AdapterProblem(
                code=code,
                module=module,
                key=key,
                peft_key=peft_key,
                adapter_shape=list(shape) if shape is not None else None,
                expected_shape=list(expected) if expected is not None else None,
            )
        )

    lora_modules: set[str] = set()
    saved = 0
    for key, (shape, _dtype) in entries.items():
        rest = key.removeprefix(PEFT_PREFIX)
        split = _split_lora_key(rest)
        if split is None:
            module = rest.rpartition(".")[0]
            if rest not in base_entries:
                problem("unrecognised_key", module, key)
                continue
            saved += 1
            leaf = rest.rpartition(".")[2]
            peft_key = (
                f"{PEFT_PREFIX}{module}.modules_to_save.{ADAPTER_NAME}.{leaf}"
                if _saved_module(config, module)
                else PEFT_PREFIX + rest
            )
            base_shape = tuple(base_entries[rest][0])
            if tuple(shape) != base_shape:
                problem("saved_module_shape", module, key, peft_key, shape, base_shape)
            continue
        module, part, param = split
        peft_key = f"{PEFT_PREFIX}{module}.{part}.{ADAPTER_NAME}" + (f".{param}" if param else "")
        layer = layers.get(module)
        if layer is None:
            problem("module_not_in_base", module, key, peft_key, shape)
            continue
        lora_modules.add(module)
        if layer.kind == "other":
            problem("unsupported_layer", module, key, peft_key, shape)
            continue
        if _targeted(config, module) is False:
            problem("not_targeted", module, key, peft_key, shape)
            continue
        expected = _expected(layer, part, param, _rank(config, module))
        if expected is None:
            if part != "lora_magnitude_vector":  # DoRA's magnitude: its shape is not modelled
                problem("unrecognised_key", module, key, peft_key, shape)
            continue
        if tuple(shape) != expected:
            problem(_shape_code(part, tuple(shape), expected), module, key, peft_key, shape, expected)
    targeted: int | None = 0
    for module, layer in layers.items():
        hit = _targeted(config, module)
        if hit is None:
            targeted = None
            break
        if not hit:
            continue
        targeted += 1
        if layer.kind == "other":
            problem("unsupported_layer", module)
        elif module not in lora_modules:
            problem("no_adapter_weights", module)
    if targeted == 0 and names:
        problem("targets_not_in_base", "")
    errors = [p for p in problems if severity(p.code) == "error"]
    loader.fits = loader.fits_as_is = not errors
    return AdapterCheck(
        peft_type=config.peft_type,
        modelled=True,
        r=config.r,
        lora_modules=len(lora_modules),
        targeted_modules=targeted,
        saved_tensors=saved,
        fits=not errors,
        problems=sorted(problems, key=lambda p: severity(p.code) != "error")[:max_listed],
        problem_count=len(problems),
        loader=loader,
    )
