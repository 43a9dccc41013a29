"""What verify_checkpoint knows without loading anything: the static scan's facts, the path, the
user's own classes. Nothing here imports torch, so the same answer comes from a worker under an
interpreter without torch (`torch_skills.checkpoint.static_only`).

Use it as `static_facts(scan_path(path, policy), max_listed)`; `own_classes(scan, roots)` says
whether every unsafe global is a class the user defined (what `torch.save(model)` writes).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from torch_skills.checkpoint.filetext import file_text
from torch_skills.checkpoint.models import FileInfo, FileProblem, PickleInfo, UnsafeGlobal
from torch_skills.checkpoint.scan import StaticScan
from torch_skills.checkpoint.verdict import (
    allowlist_recipe,
    file_verdict,
    needs_safe_globals,
    overall_verdict,
)
from torch_skills.runner.child import JobContext
from torch_skills.runner.errors import UserCodeError


def resolve_checkpoint_path(raw: str, job: JobContext) -> Path:
    """The checkpoint's path (relative to the job's folder); a bad_request naming nearby files if absent."""
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = job.cwd / path
    if not path.exists():
        parent = path.parent
        near = sorted(p.name for p in parent.iterdir())[:20] if parent.is_dir() else []
        # file names are the folder's content: escaped, cut and quoted, never prose
        hint = f"; {parent} holds the files {', '.join(repr(file_text(n, 80)) for n in near)}" if near else ""
        raise UserCodeError("bad_request", f"no checkpoint at {path}{hint}")
    return path


def static_facts(scan: StaticScan, max_listed: int) -> dict[str, Any]:
    """The result fields the static scan alone decides (format, files, verdict, unsafe globals, pickles)."""
    unsafe = scan.unsafe()
    pickles = scan.pickles()
    allowed: dict[str, str] = {}
    for p in pickles:
        allowed.update(p.globals_used)
    verdict = overall_verdict(scan)
    needs = sorted(n for n, tier in allowed.items() if tier in ("numpy", "data"))
    target = str(scan.path)
    if (
        scan.is_dir
    ):  # the recipe names the first file that needs it; files[].needs_safe_globals lists the rest
        target = next((str(f.path) for f in scan.files if needs_safe_globals(f)), str(scan.path))
    return {
        "format": scan.format if scan.format != "safetensors_index" else "safetensors_sharded",
        "files": [
            FileInfo(
                name=f.name,
                format=f.format,
                bytes=f.bytes,
                verdict=file_verdict(f),
                needs_safe_globals=needs_safe_globals(f),
            )
            for f in scan.files
        ],
        "size_bytes": scan.bytes,
        "safe": scan.safe and verdict in ("safe", "safe_with_allowlist"),
        "verdict": verdict,
        "allowlist_recipe": allowlist_recipe(needs, target) if verdict == "safe_with_allowlist" else None,
        "unsafe_globals": [
            UnsafeGlobal(
                source=u.source,
                offset=u.offset,
                opcode=u.opcode,
                qualified=u.qualified,
                risk=u.risk,
                reason=u.reason,
                called_at=u.called_at,
            )
            for u in unsafe[: max(max_listed, 10)]
        ],
        "unsafe_global_count": scan.unsafe_total(),
        "problems": [
            FileProblem(
                code=p.code,
                source=p.source,
                message=p.message,
                severity=p.severity,
                blocks_safe=p.blocks_safe,
            )
            for p in scan.problems_all()
        ],
        "pickles": [
            PickleInfo(
                source=p.source,
                protocol=p.protocol,
                pickles=p.pickles,
                opcodes=p.opcodes,
                bytes=p.size,
                complete=p.complete,
                globals_allowed=sorted(p.globals_used),
                unsafe_count=p.unsafe_total,
            )
            for p in pickles[:max_listed]
        ],
        "globals_allowed": sorted(allowed),
        "needs_safe_globals": needs,
        "scan_seconds": scan.seconds,
    }


_TORCH_CONTAINERS = ("torch.nn.modules.", "torch.nn.parameter.", "torch.nn.utils.parametrize.")


def _module_file(module: str, roots: list[Path]) -> Path | None:
    """The .py file under one of `roots` that `import module` would find there, else None (nothing imported)."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    for root in roots:
        base = Path(root).joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _defines_class(path: Path, name: str) -> bool:
    """True when the file (read, never imported) defines a top-level class `name`."""
    try:
        if path.stat().st_size > 4 << 20:
            return False
        tree = ast.parse(path.read_text("utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return False
    return any(isinstance(node, ast.ClassDef) and node.name == name for node in tree.body)


def import_roots(path: Path, roots: list[Path]) -> list[Path]:
    """Where the user's modules may live: the roots, and the checkpoint's folder with each of its
    parents up to the root holding it (a training script usually sits beside or above its output)."""
    found = [Path(r) for r in roots]
    folder = path if path.is_dir() else path.parent
    for parent in [folder, *folder.parents]:
        if not any(parent.is_relative_to(r) for r in found[: len(roots)]):
            break
        found.append(parent)
    return found


def own_classes(scan: StaticScan, roots: list[Path]) -> list[str] | None:
    """The user's own classes when every unsafe global of the scan is one (a class defined at the top
    level of a module file under the roots, read with ast, never imported) or a torch.nn
    container/layer class or a plain builtin type, with no other problem: what
    torch.save(model) of the user's model writes. None otherwise (a real payload keeps its wording)."""
    unsafe = scan.unsafe()
    if not unsafe or scan.unsafe_total() != len(unsafe) or any(p.blocks_safe for p in scan.problems_all()):
        return None
    own: set[str] = set()
    for u in unsafe:
        q = u.qualified
        if q is None or u.risk == "code_execution" or u.module is None:
            return None
        if q.startswith(_TORCH_CONTAINERS) or (u.module == "builtins" and "." not in (u.name or ".")):
            continue
        path = _module_file(u.module, roots)
        if path is None or not _defines_class(path, (u.name or "").split(".")[0]):
            return None
        own.add(f"{q} ({path})")
    return sorted(own) or None


LOADER_REFUSED = (
    "the static scan found nothing unsafe, but the format's own loader refused the file: the scan and the "
    "loader read it differently, or it is damaged; it is not called safe"
)


def not_safe(facts: dict[str, Any], verdict: str, code: str, source: str, message: str) -> None:
    """Turn a safe static verdict into `verdict` because loading the file failed."""
    facts["safe"] = False
    facts["verdict"] = verdict
    facts["allowlist_recipe"] = None
    facts["problems"].append(
        FileProblem(code=code, source=source, message=message, severity="error", blocks_safe=True)
    )
