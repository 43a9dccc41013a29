"""Which module classes to try for activation checkpointing: the repeated blocks that save the most.

Use (the worker traces each candidate with it checkpointed and reports the peak it gives):

    names = checkpoint_candidates(trace.module_types, est.saved_by_module)   # e.g. ['EncoderLayer', 'Attention']

A candidate is a class that has at least two instances with submodules of their own (a block,
not a single Linear or Conv), whose forward does the work: containers without a forward of
their own (`ModuleList`, `ModuleDict`) are never candidates, since wrapping one changes nothing.
Candidates are ranked by the activation bytes their instances (and everything inside them) save
for backward. No torch here.
"""

from __future__ import annotations

# Container classes that hold modules but have no forward: checkpointing them does nothing.
NO_FORWARD = frozenset({"ModuleList", "ModuleDict", "ParameterList", "ParameterDict"})
MAX_CANDIDATES = 3  # each candidate costs one more trace


def checkpoint_candidates(
    module_types: dict[str, str], saved_by_module: dict[str, int], limit: int = MAX_CANDIDATES
) -> list[str]:
    """Up to `limit` block classes, most activation bytes saved first (see the module docstring)."""
    names = [n for n in module_types if n]
    parents = {n.rsplit(".", 1)[0] for n in names if "." in n}  # modules with submodules
    instances: dict[str, list[str]] = {}
    for name in names:
        cls = module_types[name]
        if cls not in NO_FORWARD and name in parents:
            instances.setdefault(cls, []).append(name)
    saved: dict[str, int] = {}
    for cls, found in instances.items():
        if len(found) < 2:
            continue
        outer = [n for n in found if not any(n.startswith(o + ".") for o in found)]
        saved[cls] = sum(
            b for m, b in saved_by_module.items() if any(m == o or m.startswith(o + ".") for o in outer)
        )
    ranked = sorted((c for c in saved if saved[c] > 0), key=lambda c: -saved[c])
    return ranked[:limit]
