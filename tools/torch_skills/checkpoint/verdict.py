"""The four-way verdict of a scan, per file and overall, and the safe_globals recipe (no torch here).

Use:

    file_verdict(file_scan)            # "safe" | "safe_with_allowlist" | "unsafe" | "corrupt"
    overall_verdict(static_scan)       # the same for the whole path (folder: worst file wins)
    allowlist_recipe(names, "ckpt.pt") # Python that loads the file with weights_only=True

"corrupt" is kept apart from "unsafe" when nothing hostile was found and every blocking problem
says the bytes are unreadable (truncated, bad header, reader error): re-download or re-save it.
A verdict needs every pickle reachable from the path scanned; an unscanned archive, a bomb, an
ambiguous FRAME or a hidden zip member is "unsafe", never "corrupt".
"""

from __future__ import annotations

from torch_skills.checkpoint.problems import Problem
from torch_skills.checkpoint.scan import FileScan, StaticScan

CORRUPT_CODES = frozenset(
    """corrupt_zip corrupt_tar corrupt_npy corrupt_compressed unreadable_file unreadable_folder
    unparseable_pickle empty_file unknown_format file_not_mappable npy_truncated dcp_bad_metadata unreadable_dcp
    safetensors_truncated safetensors_bad_header safetensors_bad_entry safetensors_bad_dtype
    safetensors_bad_shape safetensors_bad_offsets safetensors_offsets_beyond_file safetensors_size_mismatch
    safetensors_header_beyond_file safetensors_bad_metadata zip_size_beyond_file zip_size_mismatch
    index_bad_json index_bad_shard""".split()
)
ALLOWLIST_TIERS = ("numpy", "data")
TORCH_CANNOT_REBUILD = frozenset({"collections.defaultdict", "collections.deque"})


def _verdict(unsafe: int, problems: list[Problem], needs: bool) -> str:
    blocking = [p for p in problems if p.blocks_safe]
    if unsafe or any(p.code not in CORRUPT_CODES for p in blocking):
        return "unsafe"
    if blocking:
        return "corrupt"
    return "safe_with_allowlist" if needs else "safe"


def needs_safe_globals(file: FileScan) -> list[str]:
    names = {q for p in file.pickles for q, tier in p.globals_used.items() if tier in ALLOWLIST_TIERS}
    return sorted(names)


def file_problems(file: FileScan) -> list[Problem]:
    """Problems of one file, including those of its pickles (unparseable, limits, FRAMEs)."""
    return StaticScan(file.path, False, file.format, [file]).problems_all()


def file_verdict(file: FileScan) -> str:
    unsafe = sum(p.unsafe_total for p in file.pickles)
    return _verdict(unsafe, file_problems(file), bool(needs_safe_globals(file)))


def overall_verdict(scan: StaticScan) -> str:
    needs = any(needs_safe_globals(f) for f in scan.files)
    return _verdict(scan.unsafe_total(), scan.problems_all(), needs)


def _import_line(qualified: str) -> tuple[str, str]:
    """(import statement, expression) naming the object; numpy 1 names map to numpy 2 modules."""
    module, _, name = qualified.rpartition(".")
    real = module.replace("numpy.core", "numpy._core", 1) if module.startswith("numpy.core") else module
    expr = f"{real}.{name}"
    if real != module:
        expr = f'({expr}, "{qualified}")'  # torch matches the name the file spells
    return f"import {real}", expr


def allowlist_recipe(names: list[str], path: str) -> str | None:
    """Python that loads `path` with weights_only=True, allowing exactly `names`."""
    if not names:
        return None
    imports = {"import torch"}
    exprs = []
    for q in names:
        line, expr = _import_line(q)
        imports.add(line)
        exprs.append(expr)
    if any(q.startswith("numpy") for q in names):
        imports.add("import numpy.dtypes")
        # weights_only checks the class of each dtype it rebuilds (numpy >= 1.25)
        exprs.append('*(getattr(numpy.dtypes, n) for n in dir(numpy.dtypes) if n.endswith("DType"))')
    body = ",\n    ".join(exprs)
    caveat = ""
    stuck = [q for q in names if q in TORCH_CANNOT_REBUILD]
    if stuck:
        caveat = (
            f"# NB: torch.load(weights_only=True) cannot rebuild {', '.join(stuck)} even when allowlisted (it only "
            "appends to lists and sets items of dicts); a plain pickle file loads with pickle.Unpickler whose "
            "find_class returns only these names.\n"
        )
    return (
        caveat
        + "\n".join(sorted(imports))
        + f"\n\nwith torch.serialization.safe_globals([\n    {body},\n]):\n"
        + f'    checkpoint = torch.load({path!r}, map_location="cpu", weights_only=True)\n'
    )
