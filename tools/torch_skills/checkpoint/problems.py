"""A structural problem found in a checkpoint file, before or instead of loading it.

Use `Problem("zip_path_traversal", "ckpt.pt::../x.pkl", "member name climbs out of the archive")`.
`blocks_safe` says whether the file can still be called safe: a corrupt, ambiguous or hostile
structure cannot (what was scanned may not be what a loader reads); a harmless oddity can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Problem:
    code: str  # stable identifier, e.g. "safetensors_offsets_overlap"
    source: str  # file (and member) it concerns
    message: str  # what is wrong and what it means for loading
    severity: Literal["error", "warning", "info"] = "error"
    blocks_safe: bool = True
