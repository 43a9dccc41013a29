"""The second net under the reference allow-list: names and objects known to load or run other code.

Use it where `torch_skills.refpolicy` (the rule) has already admitted a reference:
    refuse_by_name(CodeRef.parse("os:system"))        # server and worker: before anything is imported
    refuse_object(obj, ref)                            # worker: after import, before the call
Both raise `ReferenceRefused` (a CodeRefError: the server returns it as a tool error) naming the
rule and the fix. The allow-list decides what may run; this list only catches, by dotted name and
by the identity of the resolved object (its defining module and qualified name), the standard ways
to load or run code that a user's file might re-export (`build = os.system`) or that an installed
package's allowed class might be an alias of.

Known limitations: a deny-list never covers every installed package; it is not the rule.
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
    "Allowed: a callable in a file under an allowed root ('path/to/models.py:build'), an installed "
    "torch.nn.Module subclass ('torch.nn:Linear'), or a listed model factory ('timm:create_model'); "
    "functions that load or run other code (torch.load, torch.hub, runpy, importlib, exec/eval, "
    "subprocess, os, shutil, pickle, ...) never are."
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
                f"{ref.raw!r} is refused: it resolves to {name}, which loads or runs other code ({hit!r}). {RULE} "
                f"Fix: {_fix(ref)}."
            )
