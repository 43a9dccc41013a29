"""Worker side: resolve a code reference to a file, check it, import it, return the object.

Use it through `torch_skills.runner.usercode.load_callable(reference, cwd, roots, what)`, which
every tool's worker calls for `model`, `function`, `inputs`, `loss` and `data`:

    obj = import_reference("src/mypkg/models.py:build", cwd, roots, "the model factory")

One import path for every tool:
- the project folder (`cwd`) and its `src/` are on sys.path, so `mypkg.models:build` and the
  imports inside the user's files resolve as they do in the project;
- a file given by path that lies inside a package (its folders hold `__init__.py`) is imported as
  `mypkg.models` from the folder above the package, so its relative imports work; a lone file is
  imported under a private name with its folder on sys.path (for its siblings);
- a module reference is resolved to its file *without importing anything* (every parent package
  is located by walking the import system's finders, not imported), and every file on the way
  must lie under an allowed root or in an installed third-party distribution (site-packages,
  dist-packages); the standard library, the interpreter's built-in and frozen modules and this
  tool's own package are refused; denied names (`torch_skills.denylist`) are refused first; a
  reference that is not `model` must lie under a root (a torch.nn loss class aside) before it is
  imported;
- after the import and before anything is called, the object is admitted by the allow-list
  (`torch_skills.runner.admission`: the user's own code, an nn.Module subclass, a listed factory);
- an import that fails raises `UserCodeError("import_error")` with the real exception, the line of
  the user's file where it happened and a short traceback; a missing dependency also names the
  interpreter that ran and what to install. Nothing half-imported stays in sys.modules.

Known limitations: a module reference resolves through the finders on sys.meta_path; a custom
finder that imports code while answering find_spec would run that code (the standard ones and
editable-install finders do not).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import site
import sys
import sysconfig
from pathlib import Path
from typing import Any

from torch_skills.denylist import RULE, ReferenceRefused, refuse_by_name
from torch_skills.refpolicy import is_loss_class_reference, refused
from torch_skills.runner.admission import admit
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.tracebacks import user_location, user_traceback
from torch_skills.userspec import CodeRef, CodeRefError

_OWN_PACKAGE = Path(__file__).resolve().parents[1]
_THIRD_PARTY_DIR_NAMES = ("site-packages", "dist-packages")


# -- sys.path ---------------------------------------------------------------------------------------
def project_import_path(cwd: Path) -> list[Path]:
    """Folders put first on sys.path for the user's code: the project folder, then its src/."""
    folders = [cwd]
    if (cwd / "src").is_dir():
        folders.append(cwd / "src")
    return folders


def _ensure_on_sys_path(folder: Path) -> None:
    text = str(folder)
    if text not in sys.path:
        sys.path.insert(0, text)


# -- where a file may come from ---------------------------------------------------------------------
def _third_party_dirs() -> list[Path]:
    dirs = {Path(p) for p in site.getsitepackages() if p}
    user = site.getusersitepackages()
    if user:
        dirs.add(Path(user))
    paths = sysconfig.get_paths()
    dirs |= {Path(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
    dirs |= {Path(p) for p in sys.path if Path(p).name in _THIRD_PARTY_DIR_NAMES}
    return [d.resolve() for d in dirs]


def _stdlib_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    dirs = {Path(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    dirs |= {Path(sys.base_prefix) / "lib", Path(sys.base_exec_prefix) / "lib"}
    return [d.resolve() for d in dirs]


def where_is(file: Path, roots: list[Path]) -> str:
    """'root', 'third_party', 'stdlib', 'own' (this tool) or 'outside' for a module's file."""
    real = file.resolve()
    if real.is_relative_to(_OWN_PACKAGE):
        return "own"
    for d in _third_party_dirs():
        if real.is_relative_to(d):
            return "third_party"
    for d in _stdlib_dirs():
        if real.is_relative_to(d):
            return "stdlib"
    if any(real == r or real.is_relative_to(r) for r in roots):
        return "root"
    return "outside"


def _refuse(ref: CodeRef, why: str, fix: str) -> ReferenceRefused:
    return ReferenceRefused(f"{ref.raw!r} is refused: {why}. {RULE} Fix: {fix}.")


def check_file_location(file: Path, ref: CodeRef, roots: list[Path], what: str) -> str:
    """'root' or 'third_party' for `file` (part of `ref`); raise ReferenceRefused for anywhere else.

    A reference into an installed package must name public API: no `_private` module or attribute."""
    place = where_is(file, roots)
    if place == "third_party":
        private = next(
            (p for p in [*str(ref.module).split("."), *ref.attr.split(".")] if p.startswith("_")), None
        )
        if private is not None:
            raise _refuse(
                ref,
                f"`{private}` is a private part of an installed package, not a documented model factory",
                "use the package's public factory or class",
            )
    if place in ("root", "third_party"):
        return place
    shown = ", ".join(str(r) for r in roots) or "none"
    if place == "own":
        raise _refuse(ref, f"{file} is part of torch-skills itself", "name your own factory")
    if place == "stdlib":
        raise _refuse(
            ref,
            f"{file} is in the Python standard library, which holds no model factory",
            "write a factory in a file of your project and pass 'path/to/file.py:build'",
        )
    raise _refuse(
        ref,
        f"{what} resolves to {file}, which is neither under an allowed root ({shown}) nor in an installed "
        "package (site-packages)",
        "move the code under an allowed root, install the package, or restart the server with --allow DIR",
    )


# -- locating a module without importing it ---------------------------------------------------------
def _find_spec(fullname: str, path: list[str] | None) -> importlib.machinery.ModuleSpec | None:
    """What `importlib` would find for `fullname` given its parent's search path; imports nothing."""
    existing = sys.modules.get(fullname)
    if existing is not None:
        return getattr(existing, "__spec__", None)
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(fullname, path, None)
        if spec is not None:
            return spec
    return None


def locate_module(ref: CodeRef, roots: list[Path], what: str) -> str:
    """Check every file importing `ref.module` would run (parents first); raise if one is refused.

    Returns where the module itself lies: 'root' or 'third_party'."""
    assert ref.module is not None
    parts = ref.module.split(".")
    path: list[str] | None = None
    place = "outside"
    for i in range(len(parts)):
        fullname = ".".join(parts[: i + 1])
        try:
            spec = _find_spec(fullname, path)
        except (ImportError, ValueError, OSError) as exc:
            raise UserCodeError(
                "import_error", f"cannot locate module {fullname!r} for {what}: {exc}"
            ) from exc
        if spec is None:
            where = ", ".join(p for p in sys.path[:3] if p)
            raise UserCodeError(
                "bad_request",
                f"no module {fullname!r} for {what} {ref.raw!r} (searched the project folder, its src/ and the "
                f"installed packages of {sys.executable}; first entries of sys.path: {where}). Use "
                "'path/to/file.py:name' for a file, or install the package into that interpreter.",
            )
        origin = spec.origin
        if (
            origin in ("built-in", "frozen")
            or isinstance(spec.loader, type)
            and spec.loader
            in (
                importlib.machinery.BuiltinImporter,
                importlib.machinery.FrozenImporter,
            )
        ):
            raise _refuse(
                ref,
                f"{fullname!r} is one of the interpreter's own modules",
                "write a factory in a file of your project and pass 'path/to/file.py:build'",
            )
        if origin is not None and spec.has_location:
            place = check_file_location(Path(origin), ref, roots, what)
        elif spec.submodule_search_locations:  # a namespace package: its folders must be allowed too
            places = {check_file_location(Path(f), ref, roots, what) for f in spec.submodule_search_locations}
            place = "root" if places == {"root"} else "third_party"
        path = list(spec.submodule_search_locations) if spec.submodule_search_locations is not None else None
        if path is None and i < len(parts) - 1:
            raise UserCodeError(
                "bad_request", f"{fullname!r} is a module, not a package: {ref.module!r} cannot be imported"
            )
    return place


# -- importing --------------------------------------------------------------------------------------
def import_failed(display: str, exc: BaseException) -> UserCodeError:
    """The UserCodeError for an import of `display` that raised `exc`: real error, line, next step."""
    first = f"{type(exc).__name__}: {exc}".splitlines()[0][:1500] if str(exc) else type(exc).__name__
    where = user_location(exc)
    text = f"importing {display} failed with {first}" + (f" (at {where})" if where else "")
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        text += (
            f". The worker ran {sys.executable}, which has no module {top!r}: install it there "
            f"(`{sys.executable} -m pip install {top}`, if that is the package's name) or start the server "
            "with the interpreter of your project's environment"
        )
    else:
        text += ". Fix the import and call again"
    return UserCodeError("import_error", f"{text}.\n{user_traceback(exc, with_error=False)}")


def _package_name_for(path: Path) -> tuple[str, Path] | None:
    """('pkg.sub.mod', folder above pkg) when `path` lies in a package, else None."""
    parts = [] if path.name == "__init__.py" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.name.isidentifier():
        parts.insert(0, folder.name)
        folder = folder.parent
    if not parts or (path.name != "__init__.py" and len(parts) == 1):
        return None
    if not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts), folder


def _forget(name: str, before: set[str]) -> None:
    """Drop `name` and any module first imported during the failed import of it."""
    for key in set(sys.modules) - before:
        if key == name or key.startswith(name + ".") or key.startswith("_torch_skills_user_"):
            sys.modules.pop(key, None)


def import_file(path: Path) -> Any:
    """Import a .py file: inside a package with its package context, alone under a private name."""
    import importlib.util

    path = path.resolve()
    before = set(sys.modules)
    packaged = _package_name_for(path)
    if packaged is not None:
        name, base = packaged
        _ensure_on_sys_path(base)
        existing = sys.modules.get(name)
        if getattr(existing, "__file__", None) and Path(existing.__file__).resolve() == path:
            return existing
        try:
            module = importlib.import_module(name)
        except BaseException as exc:
            _forget(name, before)
            if isinstance(exc, (KeyboardInterrupt, SystemExit, MemoryError)):
                raise
            raise import_failed(str(path), exc) from exc
        if Path(getattr(module, "__file__", "") or "").resolve() != path:
            raise UserCodeError(
                "bad_request",
                f"{path} is part of the package {name!r}, but that name imports {module.__file__}: another "
                f"module of that name comes first on sys.path. Rename the package or pass it as a module "
                f"reference ('{name}:factory').",
            )
        return module
    name = f"_torch_skills_user_{abs(hash(str(path)))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError("bad_request", f"{path} is not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    _ensure_on_sys_path(path.parent)  # let the file import its siblings
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        _forget(name, before)
        if isinstance(exc, (KeyboardInterrupt, SystemExit, MemoryError)):
            raise
        raise import_failed(path.name, exc) from exc
    return module


def import_module(ref: CodeRef) -> Any:
    """Import `ref.module` (already located and checked); failures become import errors."""
    assert ref.module is not None
    before = set(sys.modules)
    try:
        return importlib.import_module(ref.module)
    except BaseException as exc:
        _forget(ref.module, before)
        if isinstance(exc, (KeyboardInterrupt, SystemExit, MemoryError)):
            raise
        raise import_failed(ref.module, exc) from exc


def _public_callables(module: Any) -> list[str]:
    namespace = vars(module)
    return sorted(
        name
        for name, value in namespace.items()
        if callable(value)
        and not name.startswith("_")
        and getattr(value, "__module__", None) == module.__name__
    )


def _not_found(ref: CodeRef, module: Any, missing: str) -> UserCodeError:
    found = _public_callables(module)
    listing = ", ".join(found[:30]) if found else "no public callables defined there"
    return UserCodeError(
        "bad_request", f"no callable `{ref.attr}` in {ref.display} (`{missing}` is missing); found: {listing}"
    )


def import_reference(
    reference: str, cwd: Path, roots: list[Path], what: str = "callable", *, role: str = "inputs"
) -> Any:
    """What may be called for `reference` in `role` ('model', 'inputs', 'loss', 'data', 'function'),
    after every check of the rule (`torch_skills.refpolicy`); see the module docstring."""
    try:
        ref = CodeRef.parse(reference)
        refuse_by_name(ref)
    except CodeRefError as exc:
        raise UserCodeError("bad_request", str(exc)) from exc
    roots = [Path(r).resolve() for r in roots]
    for folder in reversed(project_import_path(cwd)):
        _ensure_on_sys_path(folder)
    try:
        if ref.path is not None:
            try:
                path = Path(ref.path).expanduser()
            except RuntimeError:  # '~name' for an unknown user
                raise UserCodeError(
                    "bad_request", f"{ref.path}: '~' names no known user's home; give the full path"
                ) from None
            path = path if path.is_absolute() else cwd / path
            if not path.is_file():
                near = sorted(p.name for p in path.parent.glob("*.py"))[:20] if path.parent.is_dir() else []
                hint = f"; .py files in {path.parent}: {', '.join(near)}" if near else ""
                raise UserCodeError("bad_request", f"no file {path} for {what} {reference!r}{hint}")
            real = path.resolve()
            if real.is_relative_to(_OWN_PACKAGE):
                raise _refuse(ref, f"{real} is part of torch-skills itself", "name your own factory")
            if not any(real == r or real.is_relative_to(r) for r in roots):
                shown = ", ".join(str(r) for r in roots) or "none"
                raise UserCodeError(
                    "bad_request",
                    f"the file {real} is outside the allowed roots ({shown}); restart the server with --allow DIR "
                    "or add the folder as a root in your MCP client.",
                )
            # a file under a root may still be an installed package's (a .venv inside the project)
            place = "third_party" if where_is(real, roots) == "third_party" else "root"
            if place == "third_party" and role != "model":
                raise refused(
                    ref, role, f"{real} belongs to an installed package, not the project's own code"
                )
            module = import_file(real)
        else:
            place = locate_module(ref, roots, what)
            if place != "root" and role != "model" and not (role == "loss" and is_loss_class_reference(ref)):
                raise refused(
                    ref, role, f"{ref.module!r} is an installed package, not the project's own code"
                )
            module = import_module(ref)
        obj: Any = module
        for part in ref.attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise _not_found(ref, module, part) from None
            except Exception as exc:  # noqa: BLE001 - a module __getattr__ of the user's
                raise import_failed(f"{ref.display}:{ref.attr}", exc) from exc
        if not callable(obj):
            raise UserCodeError(
                "bad_request", f"`{ref.attr}` in {ref.display} is a {type(obj).__name__}, not a callable"
            )
        obj = admit(obj, ref, role, place, roots, cwd, where=where_is)
    except ReferenceRefused as exc:
        raise UserCodeError("bad_request", str(exc)) from exc
    return obj
