"""Which code a tool may import and call: the rule for `model`, `function`, `inputs`, `loss`, `data`.

Use it in two places:
    refuse_by_name(CodeRef.parse("os:system"))        # server and worker: before anything is imported
    refuse_object(obj, "os:system")                    # worker: after import, before the call
Both raise `ReferenceRefused` (a CodeRefError, so the server returns it as a tool error) whose
message names the rule and the fix. Where a module reference's file may lie (under an allowed
root or in an installed third-party distribution, never the standard library or the interpreter's
own modules) is checked in the worker, which sees the user's interpreter:
`torch_skills.runner.codeimport`.

The rule: a reference names a model factory, a model class, or an inputs/loss/data function the
user wrote or installed. Callables that load or run other code (files, pickles, strings, shells,
hub downloads) are refused wherever they are reached from: by their dotted name before import,
and by the identity of the object the reference resolves to (its defining module and qualified
name) after import, so `build = os.system` in a user's file or `torch:load` are refused too.

Known limitations: the list names the standard ways to load or run code in the standard library,
torch, numpy, pandas, yaml and the pickle family; a third-party function that runs code given as
an argument and is not listed (some plug-in loader of an installed package) is not recognised.
Code the user wrote runs as written: the rule decides what may be *called by name*, it is not a
sandbox for the user's own files.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from torch_skills.userspec import CodeRef, CodeRefError

# Dotted names (a module, or a module plus attribute) whose callables load or run other code.
# A reference, or the object it resolves to, matching one of these (or a name under it) is refused.
DENIED = (
    # the interpreter and the standard library's ways to run code, files, processes
    "builtins",
    "sys",
    "os",
    "posix",
    "nt",
    "subprocess",
    "_posixsubprocess",
    "runpy",
    "importlib",
    "_imp",
    "pkgutil",
    "zipimport",
    "codeop",
    "pdb",
    "bdb",
    "pty",
    "ctypes",
    "_ctypes",
    "shutil",
    "socket",
    "multiprocessing",
    "asyncio",
    "pickle",
    "_pickle",
    "copyreg",
    "marshal",
    "shelve",
    "dbm",
    "distutils",
    "ensurepip",
    # the pickle family and installers outside the standard library
    "dill",
    "cloudpickle",
    "joblib",
    "jsonpickle",
    "pip",
    "setuptools",
    "pkg_resources",
    "_distutils_hack",
    "IPython",
    # torch's loaders: pickles, TorchScript, hub code, native libraries, extensions, launchers
    "torch.load",
    "torch.serialization",
    "torch.hub",
    "torch.jit.load",
    "torch.jit._serialization",
    "torch.package",
    "torch.utils.cpp_extension",
    "torch.utils.model_zoo",
    "torch.ops.load_library",
    "torch.classes.load_library",
    "torch._ops",
    "torch.multiprocessing",
    "torch.distributed.run",
    "torch.distributed.launch",
    "torch.distributed.elastic",
    "torch._C._jit_",
    # other libraries' loaders that unpickle or evaluate
    "numpy.load",
    "numpy.lib.npyio",
    "numpy.lib._npyio_impl",
    "pandas.read_pickle",
    "pandas.io.pickle",
    "pandas.eval",
    "pandas.core.computation",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
    "transformers.dynamic_module_utils",
    "sympy.sympify",
    "sympy.core.sympify",
    "sympy.S",
    "sympy.core.singleton",
    "sympy.parsing",
    "sympy.lambdify",
    "sympy.utilities.lambdify",
    "jinja2",
    "mako",
    "numexpr",
    "torch.utils.benchmark",
    "torch.fx.graph_module",
    "torch._dynamo",
    "torch._inductor",
    "torch.utils._config_module",
    # this tool itself
    "torch_skills",
)

RULE = (
    "A reference must name a model factory, a model class, or an inputs/loss/data function: a file "
    "under an allowed root ('path/to/file.py:build') or a module of an installed package "
    "('timm:create_model', 'transformers:BertModel'). Functions that load or run other code "
    "(torch.load, torch.hub, runpy, importlib, exec/eval, subprocess, os, shutil, pickle, ...) are refused."
)


class ReferenceRefused(CodeRefError):
    """A code reference the rule above refuses."""


def _matches(dotted: str) -> str | None:
    for prefix in DENIED:
        if dotted == prefix or dotted.startswith(prefix + "."):
            return prefix
    return None


def _fix(ref: CodeRef) -> str:
    return (
        "write a small factory in a file of your project that builds and returns the model "
        f"(e.g. 'models.py:build_model'), and pass that instead of {ref.raw!r}"
    )


def refuse_by_name(ref: CodeRef) -> None:
    """Raise ReferenceRefused when `ref`'s module, or module plus attribute, is a denied name."""
    dunder = next((p for p in ref.attr.split(".") if p.startswith("__")), None)
    if dunder is not None:
        raise ReferenceRefused(
            f"{ref.raw!r} is refused: `{dunder}` is an interpreter attribute, not a factory. {RULE} Fix: {_fix(ref)}."
        )
    if ref.module is None:
        return
    hit = _matches(ref.module) or _matches(f"{ref.module}.{ref.attr}")
    if hit is not None:
        raise ReferenceRefused(
            f"{ref.raw!r} is refused: {hit!r} loads or runs other code. {RULE} Fix: {_fix(ref)}."
        )


def _defining_names(obj: Any) -> list[str]:
    """Dotted names that say where `obj` was defined: module.qualname of it, its function, its type."""
    targets = [obj]
    inner = obj
    for _ in range(8):  # unwrap partials, bound methods, decorators' __wrapped__
        if isinstance(inner, functools.partial):
            inner = inner.func
        elif hasattr(inner, "__func__"):
            inner = inner.__func__
        elif hasattr(inner, "__wrapped__") and not isinstance(inner, type):
            inner = inner.__wrapped__
        else:
            break
        targets.append(inner)
    if not isinstance(obj, type) and not inspect.isroutine(obj) and not isinstance(obj, functools.partial):
        targets.append(type(obj))  # an instance with __call__: its class counts too
    names = []
    for target in targets:
        try:
            module = getattr(target, "__module__", None)
            qualname = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
        except Exception:  # noqa: BLE001 - a hostile __getattr__ cannot hide the object
            module = qualname = None
        if isinstance(module, str):
            names.append(f"{module}.{qualname}" if isinstance(qualname, str) else module)
        self_obj = getattr(target, "__self__", None)  # builtins bound to a module: os.system, eval
        if self_obj is not None and type(self_obj).__name__ == "module":
            names.append(f"{self_obj.__name__}.{getattr(target, '__name__', '')}")
    return names


def refuse_object(obj: Any, ref: CodeRef) -> None:
    """Raise ReferenceRefused when the object `ref` resolved to is a denied callable, however reached."""
    for name in _defining_names(obj):
        hit = _matches(name)
        if hit is not None:
            raise ReferenceRefused(
                f"{ref.raw!r} resolves to {name}, which loads or runs other code ({hit!r}). {RULE} "
                f"Fix: {_fix(ref)}."
            )
