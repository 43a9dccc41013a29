"""Worker side of the reference rule: admit an imported object before anything calls it.

Use it right after the import (`torch_skills.runner.codeimport.import_reference` does):

    call = admit(obj, ref, "model", place, roots, cwd)   # raises ReferenceRefused, or returns
    model = call(**model_kwargs)                          # what may be called, wrapped if needed

The rule is `torch_skills.refpolicy`'s. An object defined in a file under an allowed root (the
user's own code) is admitted for every role. Anything else - an object of an installed package,
or one a user's file merely re-exports (`build = sympy.expand`) - is admitted only as a `model`
that is a `torch.nn.Module` subclass or a listed factory (by identity: timm's create_model,
torchvision's registered builders and get_model, transformers' from_config/_from_config bound to
an Auto class or a PreTrainedModel subclass), or as a `loss` that is a torch.nn loss class.

Nothing here calls the object or runs its package's code: classes are tested with `issubclass`
against torch's and transformers' own base classes (whose metaclass is `type` or ABCMeta), the
package modules used for identity checks are taken from `sys.modules` only (never imported here),
and attributes are read with `inspect.getattr_static` where an object could define `__getattr__`.
A listed factory is returned wrapped: its keyword arguments are checked against its list entry
(`refpolicy.check_model_kwargs`) and a transformers `config` JSON object becomes its config class.

Known limitations: `issubclass` asks the base class, so a Module subclass whose metaclass
overrides `__call__` runs that override when it is instantiated, as any Module subclass runs its
own `__init__`; the module of an installed package has been imported (import-time code ran) by
the time this check runs.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch_skills.refpolicy import (
    FACTORIES,
    Factory,
    ReferenceRefused,
    check_model_kwargs,
    refuse_object,
    refused,
)
from torch_skills.userspec import CodeRef

_BY_FAMILY = {f.name: f for f in FACTORIES}


def _static(obj: Any, name: str) -> Any:
    try:
        return inspect.getattr_static(obj, name, None)
    except Exception:  # noqa: BLE001 - a hostile object cannot hide behind its attributes
        return None


def _is_class(obj: Any) -> bool:
    return issubclass(type(obj), type)  # never isinstance: an object's __class__ may be a property


def _is(obj: Any, kind: type | tuple[type, ...]) -> bool:
    return issubclass(type(obj), kind)  # never isinstance: it may read a hostile __class__


def _unwrapped(obj: Any) -> Any:
    """The function behind partials, bound methods and decorators (read statically)."""
    inner = obj
    for _ in range(8):
        if _is(inner, functools.partial):
            inner = inner.func
        elif _is(inner, types.MethodType):
            inner = inner.__func__
        elif _is(inner, types.FunctionType) and _static(inner, "__wrapped__") is not None:
            inner = _static(inner, "__wrapped__")
        else:
            break
    return inner


def defining_file(obj: Any) -> Path | None:
    """The file of the module that defined `obj` (its function, its class), or None when unknown."""
    target = _unwrapped(obj)
    if not _is_class(target) and not _is(
        target, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)
    ):
        target = type(target)  # an instance with __call__: its class defines the code
    # functions and builtins are C types whose __module__ is a plain member; a class's is in its __dict__
    module_name = _static(target, "__module__") if _is_class(target) else target.__module__
    if type(module_name) is not str:
        return None
    module = sys.modules.get(module_name)
    file = _static(module, "__file__") if module is not None else None
    return Path(file) if type(file) is str else None


def _torch_base(name: str) -> type | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if name == "Module":
        return torch.nn.Module
    loss = sys.modules.get("torch.nn.modules.loss")
    return getattr(loss, "_Loss", None) if loss is not None else None


def _subclass(obj: Any, base: type | None) -> bool:
    if base is None or not _is_class(obj):
        return False
    try:
        return issubclass(obj, base)
    except TypeError:
        return False


def _transformers_owner(obj: Any) -> type | None:
    """The transformers class a bound from_config/_from_config belongs to, or None."""
    if not _is(obj, types.MethodType) or obj.__name__ not in ("from_config", "_from_config"):
        return None
    owner = obj.__self__
    func = obj.__func__
    func_module = func.__module__ if _is(func, types.FunctionType) else None
    if not _is_class(owner) or type(func_module) is not str or not func_module.startswith("transformers."):
        return None
    modeling = sys.modules.get("transformers.modeling_utils")
    auto = sys.modules.get("transformers.models.auto.auto_factory")
    pretrained = getattr(modeling, "PreTrainedModel", None) if modeling is not None else None
    auto_base = getattr(auto, "_BaseAutoModelClass", None) if auto is not None else None
    if obj.__name__ == "_from_config" and not _subclass(owner, pretrained):
        return None
    if _subclass(owner, pretrained) or _subclass(owner, auto_base):
        return owner
    return None


def listed_factory(obj: Any) -> Factory | None:
    """The FACTORIES entry `obj` is, by identity, or None."""
    if _is(obj, types.FunctionType):
        module = obj.__module__ if type(obj.__module__) is str else ""
        if module.startswith("timm.") and obj.__name__ == "create_model":
            return _BY_FAMILY["timm:create_model"]
        api = sys.modules.get("torchvision.models._api")
        if api is not None and module.startswith("torchvision.models"):
            if obj is getattr(api, "get_model", None):
                return _BY_FAMILY["torchvision.models:get_model"]
            builtin = getattr(api, "BUILTIN_MODELS", {})
            if isinstance(builtin, dict) and any(obj is b for b in builtin.values()):
                return _BY_FAMILY["torchvision.models:<builder>"]
    owner = _transformers_owner(obj)
    if owner is not None:
        key = "from_config" if obj.__name__ == "from_config" else "_from_config"
        return next(f for f in FACTORIES if f.family == "transformers" and f.name.endswith(f".{key}"))
    return None


def _is_pretrained_model_class(obj: Any) -> bool:
    modeling = sys.modules.get("transformers.modeling_utils")
    return _subclass(obj, getattr(modeling, "PreTrainedModel", None) if modeling is not None else None)


def _hf_config(owner: type, config: Mapping[str, Any]) -> Any:
    """A transformers config object from a JSON object: the owner's config class, or AutoConfig."""
    config = dict(config)
    config_class = _static(owner, "config_class")
    if _is_class(config_class):
        if config.get("model_type") in (None, getattr(config_class, "model_type", None)):
            config.pop("model_type", None)
        return config_class(**config)
    import transformers

    if "model_type" not in config:
        raise ReferenceRefused(
            f'{owner.__name__}.from_config needs config.model_type (e.g. "bert") to pick the configuration class'
        )
    return transformers.AutoConfig.for_model(**config)


def _converted(owner: type | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(kwargs)
    if owner is not None and isinstance(out.get("config"), Mapping):
        out["config"] = _hf_config(owner, out["config"])
    torch = sys.modules.get("torch")
    for key in ("torch_dtype", "dtype"):
        if isinstance(out.get(key), str) and torch is not None:
            out[key] = getattr(torch, out[key])
    return out


def _checked_call(
    obj: Any, factory: Factory | None, owner: type | None, cwd: Path, roots: Sequence[Path]
) -> Callable[..., Any]:
    """`obj`, called only with model_kwargs its list entry accepts, JSON configs turned into objects."""

    def call(**kwargs: Any) -> Any:
        check_model_kwargs(kwargs, cwd, roots, factory)
        return obj(**_converted(owner, kwargs))

    call.__name__ = getattr(obj, "__name__", "factory")
    call.__wrapped_factory__ = obj  # type: ignore[attr-defined]
    return call


def _own_code(file: Path, roots: list[Path], where: Callable[[Path, list[Path]], str] | None) -> bool:
    if where is not None:
        return where(file, roots) == "root"
    return any(file.resolve().is_relative_to(r) for r in roots)


def admit(
    obj: Any,
    ref: CodeRef,
    role: str,
    place: str,
    roots: Sequence[Path],
    cwd: Path,
    *,
    where: Callable[[Path, list[Path]], str] | None = None,
) -> Any:
    """What may be called for `ref` in `role` (see the module docstring); ReferenceRefused otherwise.

    `place` is where the reference's own file lies: 'root' (a file or project package under an
    allowed root) or 'third_party' (an installed distribution). `where(file, roots)` says where a
    file lies ('root', 'third_party', 'stdlib', ...; `codeimport.where_is`), so that an installed
    package inside a root (a .venv in the project) never counts as the user's own code."""
    refuse_object(obj, ref)  # the second net, by identity
    if place == "root":
        file = defining_file(obj)
        if file is not None and _own_code(file, list(roots), where):
            return obj  # the user's own code
    if role == "model":
        if _subclass(obj, _torch_base("Module")):
            if _is_pretrained_model_class(obj):
                return _checked_call(obj, None, obj, cwd, roots)
            return obj
        factory = listed_factory(obj)
        if factory is not None:
            return _checked_call(obj, factory, _transformers_owner(obj), cwd, roots)
        what = (
            "an installed class that is not a torch.nn.Module subclass"
            if _is_class(obj)
            else ("an installed callable that is not a listed model factory")
        )
        if place == "root":
            what = f"defined outside the allowed roots ({what}), re-exported by a file of the project"
        raise refused(ref, role, f"it is {what}")
    if role == "loss" and _subclass(obj, _torch_base("_Loss")):
        module = _static(obj, "__module__")
        module = module if type(module) is str else ""
        if module.startswith("torch.nn."):
            return obj
    where = "defined outside the allowed roots" if place == "root" else "from an installed package"
    raise refused(ref, role, f"it is {where}, not the project's own code")
