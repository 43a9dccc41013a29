"""The reference rule: which code a tool may call, as an allow-list checked before anything is called.

Use it on the server, before any worker starts (no torch, nothing imported):

    factory = check_reference(CodeRef.parse("timm:create_model"), "model", cwd=roots.cwd)
    check_model_kwargs({"model_name": "resnet18", "pretrained": False}, cwd, roots.all, factory)

and in the worker, after the import and before the call: `torch_skills.runner.admission.admit`.
Both raise `ReferenceRefused` (a CodeRefError, so the server returns it as a tool error) whose text
says what IS allowed and how to get there.

The rule, by role:
- `model`: (a) a callable in a file under an allowed root ('path/to/models.py:build', or a module
  of the project's own package under the roots, 'mypkg.models:build'); or (b) from an installed
  third-party distribution, a class that is a `torch.nn.Module` subclass (checked by `issubclass`
  before it is instantiated: 'torch.nn:Linear', 'transformers:BertModel' with model_kwargs
  {"config": {...}}), or a function on `FACTORIES`, called only with the keyword arguments listed
  there. Nothing that loads weights or code is listed: never `from_pretrained`.
- `inputs`, `data`, `function`: a callable in a file under an allowed root (or the project's own
  package). `loss` also takes a `torch.nn` loss class ('torch.nn:CrossEntropyLoss'), built with
  no arguments and called as loss(output, target).
- `model_kwargs` is JSON, and is checked the same way for every factory (`check_model_kwargs`):
  a string that looks like a path must resolve inside the roots; `trust_remote_code`, download
  flags (`pretrained=True`, `weights`/`weights_backbone` not None, checkpoint or cache paths, hub
  ids such as "org/name", URLs) and callable-by-name strings ("pkg.mod:fn", "pkg.mod.fn") are
  refused.
Everything else is refused. `torch_skills.denylist` stays underneath as a second net.

Known limitations: a listed factory or an allowed class runs its own constructor with the allowed
JSON arguments, so the list holds only constructors that build modules from sizes and names; an
installed nn.Module subclass whose __init__ reads a file named by a plain word (no '/', no
extension) is not recognised. A third-party module is imported (its import-time code runs) before
`issubclass` can be asked: only modules inside installed distributions or under the roots are
imported, never the standard library or a file elsewhere.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from torch_skills.denylist import ReferenceRefused, refuse_by_name, refuse_object
from torch_skills.userspec import REFERENCE_FIELDS, CodeRef

__all__ = [
    "FACTORIES",
    "Factory",
    "ReferenceRefused",
    "Role",
    "check_model_kwargs",
    "check_reference",
    "factory_named",
    "refuse_by_name",
    "refuse_object",
]

Role = Literal["model", "inputs", "loss", "data", "function"]
ROLES: tuple[Role, ...] = REFERENCE_FIELDS  # the request fields that name code (userspec)

RULE_MODEL = (
    "`model` may name (a) a factory or class in a file under an allowed root ('path/to/models.py:build', "
    "or a module of your project's own package, 'mypkg.models:build'), or (b) from an installed package, "
    "a torch.nn.Module subclass ('torch.nn:Linear'; 'transformers:BertModel' with model_kwargs "
    '{"config": {...}}) or a listed model factory: '
)
RULE_CODE = (
    "`{role}` must name a callable in a file under an allowed root ('path/to/file.py:{example}', or a "
    "module of your project's own package, 'mypkg.data:{example}')"
)
RULE_LOSS_EXTRA = ", or a torch.nn loss class ('torch.nn:CrossEntropyLoss')"
FIX_MODEL = (
    "write a small factory in a file of your project that builds and returns the model (e.g. "
    "'models.py:build_model'), or name an nn.Module class or a listed factory"
)
_EXAMPLES = {"inputs": "make_inputs", "loss": "loss_fn", "data": "make_loader", "function": "MyFunction"}


# -- the factory list ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Factory:
    """One listed model factory: its documented name, the keyword arguments it is called with, and
    the values some of them must have (anything else would download weights or code)."""

    name: str  # as documented, e.g. 'timm:create_model'
    family: Literal["timm", "torchvision", "transformers"]
    accepts: frozenset[str]
    fixed: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # argument -> allowed values
    note: str = ""

    def rule(self) -> str:
        fixed = ", ".join(f"{k}={' or '.join(map(repr, v))}" for k, v in self.fixed.items())
        return f"{self.name} ({fixed})" if fixed else self.name


_TIMM_ARGS = frozenset(
    {
        "model_name", "pretrained", "num_classes", "in_chans", "global_pool", "drop_rate",
        "drop_path_rate", "drop_block_rate", "img_size", "patch_size", "embed_dim", "depth",
        "num_heads", "mlp_ratio", "class_token", "qkv_bias", "features_only", "out_indices",
        "scriptable", "exportable", "no_jit",
    }
)  # fmt: skip
_TORCHVISION_ARGS = frozenset(
    {
        "weights", "weights_backbone", "progress", "num_classes", "aux_logits", "transform_input",
        "init_weights", "dropout", "attention_dropout", "quantize", "zero_init_residual", "groups",
        "width_per_group", "stochastic_depth_prob", "image_size", "trainable_backbone_layers",
        "min_size", "max_size",
    }
)  # fmt: skip
_TORCHVISION_SUBPACKAGES = ("detection", "segmentation", "video", "optical_flow", "quantization")
_DTYPES = ("float32", "float16", "bfloat16")

FACTORIES: tuple[Factory, ...] = (
    Factory(
        "timm:create_model",
        "timm",
        _TIMM_ARGS,
        {"pretrained": (False,)},
        "model_name is an architecture name ('resnet18'), never 'hf-hub:...' or a path",
    ),
    Factory(
        "torchvision.models:<builder>",
        "torchvision",
        _TORCHVISION_ARGS,
        {"weights": (None,), "weights_backbone": (None,), "quantize": (False,)},
        "any registered model builder (resnet18, vit_b_16, ...) of torchvision.models or its subpackages",
    ),
    Factory(
        "torchvision.models:get_model",
        "torchvision",
        _TORCHVISION_ARGS | {"name"},
        {"weights": (None,), "weights_backbone": (None,), "quantize": (False,)},
    ),
    Factory(
        "transformers:<AutoModel class or model class>.from_config",
        "transformers",
        frozenset({"config", "torch_dtype", "dtype", "attn_implementation"}),
        {"torch_dtype": _DTYPES, "dtype": _DTYPES, "attn_implementation": ("eager", "sdpa")},
        'config is a JSON object: {"model_type": "bert", "hidden_size": 64, ...} for an Auto class',
    ),
    Factory(
        "transformers:<model class>._from_config",
        "transformers",
        frozenset({"config", "torch_dtype", "dtype", "attn_implementation"}),
        {"torch_dtype": _DTYPES, "dtype": _DTYPES, "attn_implementation": ("eager", "sdpa")},
    ),
)
_BY_NAME = {f.name: f for f in FACTORIES}


def factories_text() -> str:
    return "; ".join(f.rule() for f in FACTORIES)


def factory_named(ref: CodeRef) -> Factory | None:
    """The listed factory `ref` names by its spelling, or None (the worker confirms by identity)."""
    module, parts = ref.module or "", ref.attr.split(".")
    if module in ("timm", "timm.models") and ref.attr == "create_model":
        return _BY_NAME["timm:create_model"]
    sub = module.split(".")
    if sub[:2] == ["torchvision", "models"] and (
        len(sub) == 2 or sub[2:] in ([s] for s in _TORCHVISION_SUBPACKAGES)
    ):
        if ref.attr == "get_model":
            return _BY_NAME["torchvision.models:get_model"]
        if len(parts) == 1 and not ref.attr.startswith("_") and ref.attr.islower():
            return _BY_NAME["torchvision.models:<builder>"]
    if sub[0] == "transformers" and len(parts) == 2 and not parts[0].startswith("_"):
        if parts[1] == "from_config":
            return _BY_NAME["transformers:<AutoModel class or model class>.from_config"]
        if parts[1] == "_from_config":
            return _BY_NAME["transformers:<model class>._from_config"]
    return None


# -- the static check of a reference --------------------------------------------------------------
def rule_text(role: str) -> str:
    """What IS allowed for `role`, in one sentence."""
    if role == "model":
        return f"{RULE_MODEL}{factories_text()}. Nothing that loads weights or code runs."
    text = RULE_CODE.format(role=role, example=_EXAMPLES.get(role, "name"))
    return text + (RULE_LOSS_EXTRA if role == "loss" else "") + "."


def refused(ref: CodeRef, role: str, why: str, fix: str | None = None) -> ReferenceRefused:
    """A ReferenceRefused whose text says why, what IS allowed and the fix."""
    if fix is None:
        fix = (
            FIX_MODEL
            if role == "model"
            else f"put the function in a file under an allowed root and pass 'path/to/file.py:{_EXAMPLES.get(role, 'name')}'"
        )
    return ReferenceRefused(f"{ref.raw!r} is refused as {role}: {why}. {rule_text(role)} Fix: {fix}.")


def project_module(module: str, cwd: Path) -> bool:
    """Whether `module`'s top-level package is a folder or file of the project (cwd or cwd/src),
    which the worker puts first on sys.path; read from the file system only."""
    top = module.split(".")[0]
    return any((base / top).is_dir() or (base / f"{top}.py").is_file() for base in (cwd, cwd / "src"))


# Attribute names of installed classes that load weights, files or code: never a model factory.
LOADER_NAMES = frozenset(
    {
        "from_pretrained",
        "from_single_file",
        "from_file",
        "load",
        "loads",
        "load_state_dict",
        "from_hub",
        "load_from_checkpoint",
    }
)


def is_loss_class_reference(ref: CodeRef) -> bool:
    """'torch.nn:CrossEntropyLoss' and the like (the worker checks it is a torch.nn loss class)."""
    return (
        ref.module in ("torch.nn", "torch.nn.modules.loss")
        and "." not in ref.attr
        and ref.attr.endswith("Loss")
    )


def check_reference(ref: CodeRef, role: str, *, cwd: Path) -> Factory | None:
    """Refuse, before any worker starts, what the rule refuses by spelling; return the listed factory
    `ref` names (its keyword arguments are checked by `check_model_kwargs`), else None.

    What the spelling cannot decide (is this installed class an nn.Module subclass?) is decided in
    the worker after the import and before the call (`torch_skills.runner.admission`)."""
    refuse_by_name(ref)  # dunders and the second net
    if ref.path is not None:
        return None  # a file: the roots check decides (run_in_worker), the worker checks identity
    assert ref.module is not None
    if project_module(ref.module, cwd):
        return None  # the project's own package: the worker confirms its files lie under a root
    if role != "model":
        if role == "loss" and is_loss_class_reference(ref):
            return None
        raise refused(ref, role, f"{ref.module!r} is not a file or package of the project")
    factory = factory_named(ref)
    if factory is not None:
        return factory
    parts = ref.attr.split(".")
    if parts[-1] in LOADER_NAMES:
        raise refused(ref, role, f"`{parts[-1]}` loads weights, files or code")
    if len(parts) > 1:
        raise refused(ref, role, f"`{ref.attr}` is not an installed class or a listed factory")
    return None


# -- model_kwargs --------------------------------------------------------------------------------
# Keys whose value asks a constructor to download or load something; allowed only as "off".
_OFF_ONLY: dict[str, tuple[Any, ...]] = {
    "trust_remote_code": (False, None),
    "pretrained": (False, None, 0),
    "pretrained_backbone": (False, None, 0),
    "weights": (None,),
    "weights_backbone": (None,),
    "checkpoint_path": (None, ""),
    "pretrained_cfg": (None,),
    "pretrained_cfg_overlay": (None,),
    "cache_dir": (None,),
    "pretrained_model_name_or_path": (None,),
    "repo_id": (None,),
    "auto_map": (None,),
    "code_revision": (None,),
    "quantization_config": (None,),
    "url": (None,),
}
_URL = re.compile(r"^[A-Za-z][\w+.-]*://")
_HUB_PREFIXES = ("hf-hub:", "hf_hub:", "hf:", "local-dir:", "timm/")
_CALLABLE_REF = re.compile(r"^\s*[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\s*:\s*[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\s*$")
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_FILE_SUFFIXES = (
    ".py", ".pt", ".pth", ".pt2", ".bin", ".safetensors", ".ckpt", ".json", ".yaml", ".yml", ".pkl",
    ".pickle", ".npy", ".npz", ".onnx", ".h5", ".msgpack", ".gguf", ".txt", ".so", ".model", ".cfg",
    ".toml", ".tar", ".zip", ".gz", ".distcp",
)  # fmt: skip


@functools.cache
def _importable_top_names() -> frozenset[str]:
    """Top-level module names of the standard library and of the installed distributions (metadata only)."""
    from importlib.metadata import packages_distributions

    try:
        installed = set(packages_distributions())
    except Exception:  # noqa: BLE001 - broken metadata of one package must not break the check
        installed = set()
    return frozenset(installed | set(sys.stdlib_module_names) | set(sys.builtin_module_names))


def _looks_like_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.startswith(("~", ".")) or text.lower().endswith(_FILE_SUFFIXES)


def _inside(text: str, cwd: Path, roots: Iterable[Path]) -> tuple[bool, bool]:
    """(resolves inside a root, exists) for a path-like string, relative paths from `cwd`."""
    try:
        p = Path(text).expanduser()
    except RuntimeError:
        return False, False
    p = p if p.is_absolute() else cwd / p
    try:
        real = Path(os.path.realpath(p))
    except (OSError, ValueError):
        return False, False
    inside = any(real == Path(r) or real.is_relative_to(Path(r)) for r in roots)
    return inside, os.path.lexists(p)


class ModelArgsRefused(ReferenceRefused):
    """A model_kwargs value the rule refuses."""


def _refuse_arg(where: str, why: str, fix: str) -> ModelArgsRefused:
    return ModelArgsRefused(
        f"model_kwargs{where} is refused: {why}. model_kwargs are JSON sizes, names and flags; paths must lie "
        "under an allowed root, and nothing may download weights or code or name a callable. "
        f"Fix: {fix}."
    )


def _check_value(value: Any, where: str, cwd: Path, roots: tuple[Path, ...], depth: int = 0) -> None:
    if depth > 32:
        raise _refuse_arg(
            where, "it is nested more than 32 levels deep", "pass a flat object of sizes and names"
        )
    if isinstance(value, Mapping):
        for key, item in value.items():
            sub = f"{where}[{key!r}]"
            key_l = str(key).lower()
            if key_l in _OFF_ONLY and item not in _OFF_ONLY[key_l]:
                allowed = " or ".join(map(repr, _OFF_ONLY[key_l]))
                raise _refuse_arg(
                    sub,
                    f"{key!r}={item!r} would download or load weights or code",
                    f"leave it out or set it to {allowed}; to check trained weights, build the model here and "
                    "pass the checkpoint file to verify_checkpoint",
                )
            _check_value(item, sub, cwd, roots, depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(item, f"{where}[{i}]", cwd, roots, depth + 1)
        return
    if not isinstance(value, str):
        return
    text = value.strip()
    if _URL.match(text) or text.lower().startswith(_HUB_PREFIXES):
        raise _refuse_arg(
            where,
            f"{value[:200]!r} names a download",
            "build the model from its configuration, without weights",
        )
    if _CALLABLE_REF.match(text) and not _looks_like_path(text.split(":", 1)[0]):
        raise _refuse_arg(
            where, f"{value[:200]!r} names a callable", "pass a plain name your factory maps to code"
        )
    dotted = _DOTTED.match(text) and not text.lower().endswith(_FILE_SUFFIXES)
    if dotted and (text.count(".") >= 2 or text.split(".")[0] in _importable_top_names()):
        raise _refuse_arg(
            where,
            f"{value[:200]!r} names a callable or module",
            "pass a plain name your factory maps to code",
        )
    if _looks_like_path(text):
        inside, exists = _inside(text, cwd, roots)
        if not inside:
            shown = ", ".join(str(r) for r in roots) or "none"
            raise _refuse_arg(
                where,
                f"the path {value[:200]!r} lies outside the allowed roots ({shown})",
                "move the file under an allowed root, restart the server with --allow DIR, or add the folder as a "
                "root in your MCP client",
            )
        if not exists and _HUB_ID.match(text):
            raise _refuse_arg(
                where,
                f"{value[:200]!r} names no file under the roots and reads as a hub id ('org/name'), which would be "
                "downloaded",
                "pass a configuration (sizes) instead, or a folder under an allowed root",
            )


def check_model_kwargs(
    kwargs: Mapping[str, Any], cwd: Path, roots: Iterable[Path], factory: Factory | None = None
) -> None:
    """Refuse model_kwargs the rule refuses (see the module docstring); with a listed `factory`,
    also any argument it does not accept and any value its `fixed` arguments may not take."""
    roots = tuple(Path(os.path.realpath(r)) for r in roots)
    _check_value(dict(kwargs), "", Path(cwd), roots)
    if factory is None:
        return
    unknown = sorted(set(kwargs) - factory.accepts)
    if unknown:
        raise _refuse_arg(
            "",
            f"{factory.name} is called only with {', '.join(sorted(factory.accepts))}; not {', '.join(unknown)}",
            "drop those arguments, or write a factory in a file of your project that passes them",
        )
    for key, allowed in factory.fixed.items():
        if key in kwargs and kwargs[key] not in allowed:
            raise _refuse_arg(
                f"[{key!r}]",
                f"{factory.name} runs only with {key}={' or '.join(map(repr, allowed))}",
                f"set {key} to {allowed[0]!r} or leave it out",
            )
    if factory.family == "timm":
        name = kwargs.get("model_name")
        if name is not None and (not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name)):
            raise _refuse_arg(
                "['model_name']", f"{name!r} is not an architecture name", "pass a name such as 'resnet18'"
            )
    if factory.family == "transformers" and "config" in kwargs and not isinstance(kwargs["config"], Mapping):
        raise _refuse_arg(
            "['config']",
            "config must be a JSON object of the model's configuration",
            'pass {"config": {"model_type": "bert", "hidden_size": 64, ...}}',
        )
