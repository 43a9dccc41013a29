"""Census of the reference rule over every installed distribution: what it admits, and that it calls nothing.

Run: `python -m tests.reference_census` (prints one JSON object); tests/test_reference_census.py
runs it in a fresh interpreter. It imports the top-level modules of every distribution that
importlib.metadata lists (then also their public submodules those imports loaded), takes every
public callable attribute, and asks `torch_skills.runner.admission.admit` about it in every role,
as a reference into an installed package would be asked in the worker. While it asks, a profile
hook records every Python frame entered and every C function called.

An independent oracle says what may be admitted: as `model`, a class that is a torch.nn.Module
subclass or one of the listed factories found by name (timm.create_model, torchvision's
registered builders); as `loss`, a torch.nn loss class; nothing else in any role.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import os
import sys
import sysconfig
import tempfile
from importlib.metadata import distributions
from pathlib import Path

SKIP_TOPS = {"torch_skills", "tests", "antigravity", "this"}


def _tops() -> set[str]:
    tops: set[str] = set()
    for dist in distributions():
        text = dist.read_text("top_level.txt")
        names = text.split() if text else []
        if not names:
            for file in dist.files or ():
                first = file.parts[0]
                if first.endswith(".py"):
                    names.append(first[:-3])
                elif "." not in first and len(file.parts) > 1 and file.parts[1] == "__init__.py":
                    names.append(first)
        tops.update(n for n in names if n.isidentifier() and not n.startswith("_"))
    return tops - SKIP_TOPS


def _import_all(tops: set[str]) -> list[str]:
    imported = []
    for name in sorted(tops):
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                importlib.import_module(name)
            imported.append(name)
        except BaseException:  # noqa: BLE001 - a package that cannot import here is simply not counted
            continue
    return imported


def _oracle_factories() -> set[int]:
    ids = set()
    timm = sys.modules.get("timm")
    if timm is not None and hasattr(timm, "create_model"):
        ids.add(id(timm.create_model))
    api = sys.modules.get("torchvision.models._api")
    if api is not None:
        ids.add(id(api.get_model))
        ids.update(id(b) for b in api.BUILTIN_MODELS.values())
    return ids


def main() -> dict:
    import torch

    from torch_skills.refpolicy import ROLES, ReferenceRefused
    from torch_skills.runner.admission import admit
    from torch_skills.userspec import CodeRef

    tops = _tops()
    imported = set(_import_all(tops))
    modules = sorted(
        name
        for name, module in list(sys.modules.items())
        if module is not None
        and name.split(".")[0] in imported
        and not any(part.startswith("_") for part in name.split("."))
    )
    candidates: dict[int, tuple[str, str, object]] = {}
    for name in modules:
        try:
            namespace = dict(vars(sys.modules[name]))
        except TypeError:
            continue
        for attr, value in namespace.items():
            if attr.startswith("_") or not callable(value) or id(value) in candidates:
                continue
            candidates[id(value)] = (name, attr, value)

    factories = _oracle_factories()
    loss_base = torch.nn.modules.loss._Loss

    def expected(obj: object, role: str) -> bool:
        is_class = issubclass(type(obj), type)
        if role == "model":
            return (is_class and issubclass(obj, torch.nn.Module)) or id(obj) in factories
        if role == "loss":
            return is_class and issubclass(obj, loss_base) and obj.__module__.startswith("torch.nn.")
        return False

    # The checker's own helpers (inspect.getattr_static, ...) may also be re-exported by a package:
    # entering them is the check itself, not a call of the candidate.
    checker_modules = {"inspect", "functools", "abc", "types", "typing", "pathlib", "posixpath", "os"}
    own = str(Path(__import__("torch_skills").__file__).resolve().parent)
    stdlib = [str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "platstdlib")]

    def in_stdlib(code) -> bool:  # noqa: ANN001
        return any(os.path.realpath(code.co_filename).startswith(s) for s in stdlib)

    # A decorated third-party candidate may share its code with every function so decorated
    # (contextlib's `helper` for each @contextmanager, in its methods too): that wrapper is the standard
    # library's, which the check itself uses; the candidate's own code is what it wraps (`__wrapped__`).
    codes = set()
    builtin_ids = set()
    for _, _, obj in candidates.values():
        is_function = type(obj).__name__ in ("function", "builtin_function_or_method")
        module = obj.__module__ if is_function else inspect.getattr_static(obj, "__module__", None)
        if module == "builtins":  # a re-exported builtin (next, len) is the checker's own tool too
            builtin_ids.add(id(obj))
            continue
        if module in checker_modules:
            continue
        wrapped = inspect.getattr_static(obj, "__wrapped__", None) if is_function else None
        for fn in (
            obj,
            wrapped,
            *(inspect.getattr_static(obj, n, None) for n in ("__init__", "__new__", "__call__")),
        ):
            code = getattr(fn, "__code__", None) if type(fn).__name__ == "function" else None
            if code is None:
                continue
            shared_wrapper = in_stdlib(code) and str(module).split(".")[0] not in sys.stdlib_module_names
            if not shared_wrapper:
                codes.add(id(code))
    entered_foreign: list[str] = []
    called: list[str] = []
    ids = set(candidates) - builtin_ids

    def hook(frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event == "call":
            code = frame.f_code
            if id(code) in codes:
                called.append(f"{code.co_filename}:{code.co_name}")
            file = os.path.realpath(code.co_filename) if not code.co_filename.startswith("<") else ""
            if file and not file.startswith(own) and not any(file.startswith(s) for s in stdlib):
                entered_foreign.append(f"{code.co_filename}:{code.co_name}")
        elif event == "c_call" and id(arg) in ids:
            called.append(repr(arg)[:120])

    wrong: list[str] = []
    admitted = dict.fromkeys(ROLES, 0)
    root = Path(tempfile.mkdtemp(prefix="census-root-"))
    checks = 0
    for name, attr, obj in candidates.values():
        ref = CodeRef(raw=f"{name}:{attr}", module=name, attr=attr)
        for role in ROLES:
            sys.setprofile(hook)
            try:
                admit(obj, ref, role, "third_party", [root], root)
                ok = True
            except ReferenceRefused:
                ok = False
            finally:
                sys.setprofile(None)
            checks += 1
            admitted[role] += ok
            if ok and not expected(obj, role):
                wrong.append(f"{role}: {name}:{attr}")
    os.rmdir(root)
    return {
        "distributions_top_level": len(tops),
        "imported_top_level": len(imported),
        "modules": len(modules),
        "callables": len(candidates),
        "checks": checks,
        "admitted": admitted,
        "wrongly_admitted": wrong[:50],
        "candidate_code_entered": sorted(set(called))[:50],
        "third_party_frames_entered": sorted(set(entered_foreign))[:50],
    }


if __name__ == "__main__":
    print(json.dumps(main()))
