"""Does a checkpoint's state dict fit a model's? Missing, unexpected, mismatched keys, and the fix.

Use:

    report = compare_state_dicts(ckpt, model)   # each: {key: (shape tuple, dtype name)}
    report.fix.describe()    # "strip the 'module.' prefix (DistributedDataParallel)"
    report.fix.apply(key)    # the checkpoint key renamed the way the fix says
    report.missing, report.unexpected, report.shape_mismatches

Wrappers leave their attribute name in every key: DistributedDataParallel and DataParallel
`module.`, torch.compile `_orig_mod.`, FSDP `_fsdp_wrapped_module.`, activation checkpointing
`_checkpoint_wrapped_module.` (those two at any depth), Lightning Fabric `_forward_module.`;
a LightningModule's own attribute (`model.`) prefixes everything too. The candidate renames
(removing wrapper components at the front or anywhere, stripping or adding the most common
leading component) are each scored by how many renamed keys the model has; the best one is
reported when it beats leaving the keys alone.

Two rules of the loaders themselves come first (see torch_skills.checkpoint.modelkeys):
- `library`: the key rename the model's library applies on load (Hugging Face `from_pretrained`:
  its registered renames, gamma/beta, `base_model_prefix`), applied to every checkpoint key before
  the wrapper renames are scored;
- `tied`: model keys that share storage with another key. A missing key whose tied partner is in
  the checkpoint is not missing (the one tensor is filled either way): it is listed in
  `tied_missing`, and the fit holds.

Known limitations: renames beyond these (a changed submodule name in the middle of keys) are
reported as missing/unexpected pairs, not guessed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

WRAPPER_COMPONENTS = {
    "module": "DistributedDataParallel / DataParallel",
    "_orig_mod": "torch.compile",
    "_fsdp_wrapped_module": "FullyShardedDataParallel",
    "_checkpoint_wrapped_module": "activation checkpointing (checkpoint_wrapper)",
    "_forward_module": "Lightning Fabric",
}

Entry = tuple[tuple[int, ...], str]  # (shape, dtype name)


@dataclass(frozen=True)
class LibraryRename:
    """The key rename a model library applies when it loads a checkpoint (e.g. from_pretrained's)."""

    name: str  # e.g. "transformers from_pretrained key renames"
    rename: Callable[[str], str] = field(compare=False)


@dataclass(frozen=True)
class KeyFix:
    """A rename of checkpoint keys: the library's own rename, drop wrapper components, then strip and/or add a prefix."""

    remove_components: tuple[str, ...] = ()
    everywhere: bool = False  # drop them at any depth, not only in front
    strip_prefix: str = ""
    add_prefix: str = ""
    library: LibraryRename | None = None  # applied first; the library's loader does it, not user code

    @property
    def is_identity(self) -> bool:
        return not (self.remove_components or self.strip_prefix or self.add_prefix)

    def apply(self, key: str) -> str:
        if self.library is not None:
            key = self.library.rename(key)
        return self.wrapper_rename(key)

    def wrapper_rename(self, key: str) -> str:
        if self.remove_components:
            parts = key.split(".")
            if self.everywhere:
                parts = [p for p in parts if p not in self.remove_components]
            else:
                while len(parts) > 1 and parts[0] in self.remove_components:
                    parts = parts[1:]
            key = ".".join(parts)
        if self.strip_prefix and key.startswith(self.strip_prefix):
            key = key[len(self.strip_prefix) :]
        return self.add_prefix + key

    def describe(self) -> str:
        steps = []
        for c in self.remove_components:
            where = "at every depth" if self.everywhere else "in front"
            steps.append(f"remove '{c}.' {where} ({WRAPPER_COMPONENTS.get(c, 'a wrapper')})")
        if self.strip_prefix:
            steps.append(f"strip the '{self.strip_prefix}' prefix")
        if self.add_prefix:
            steps.append(f"add the '{self.add_prefix}' prefix")
        if self.library is not None:
            steps.insert(0, f"the loader's own rename ({self.library.name})")
        return "; ".join(steps) or "no rename"

    def code(self) -> str:
        """Python that applies the rename to `state_dict` before `model.load_state_dict`."""
        if self.is_identity:
            return ""
        single_front = len(self.remove_components) == 1 and not self.everywhere and not self.strip_prefix
        only_strip = not self.remove_components and self.strip_prefix
        if (single_front or only_strip) and not self.add_prefix:
            prefix = self.strip_prefix or self.remove_components[0] + "."
            return (
                "from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present\n"
                f'consume_prefix_in_state_dict_if_present(state_dict, "{prefix}")'
            )
        lines = ["def fix_key(key):"]
        if self.remove_components:
            names = ", ".join(f'"{c}"' for c in self.remove_components)
            if self.everywhere:
                lines.append(f'    key = ".".join(p for p in key.split(".") if p not in ({names},))')
            else:
                lines.append(f'    while "." in key and key.split(".", 1)[0] in ({names},):')
                lines.append('        key = key.split(".", 1)[1]')
        if self.strip_prefix:
            lines.append(f'    key = key.removeprefix("{self.strip_prefix}")')
        lines.append(f'    return "{self.add_prefix}" + key' if self.add_prefix else "    return key")
        lines.append("state_dict = {fix_key(k): v for k, v in state_dict.items()}")
        return "\n".join(lines)


@dataclass
class ShapeMismatch:
    key: str  # the model's key
    checkpoint_key: str
    checkpoint_shape: list[int]
    model_shape: list[int]
    checkpoint_dtype: str
    model_dtype: str


@dataclass
class FitReport:
    fix: KeyFix
    matched_before: int
    matched: int
    checkpoint_keys: int
    model_keys: int
    missing: list[str] = field(default_factory=list)  # model keys the checkpoint lacks
    unexpected: list[str] = field(default_factory=list)  # checkpoint keys the model lacks
    shape_mismatches: list[ShapeMismatch] = field(default_factory=list)
    dtype_mismatches: list[ShapeMismatch] = field(default_factory=list)
    collisions: list[str] = field(default_factory=list)  # renamed keys two checkpoint keys map to
    tied_missing: list[str] = field(
        default_factory=list
    )  # absent, but a key sharing their storage is present
    library: str | None = None  # the library rename applied before the comparison, if any
    library_renamed: int = 0  # checkpoint keys the library rename changed

    @property
    def fits(self) -> bool:
        return not (self.missing or self.unexpected or self.shape_mismatches or self.collisions)


def _leading(keys: list[str], depth: int = 1) -> list[str]:
    """The most common leading components (one or two deep) as prefixes, most frequent first."""
    counts: Counter[str] = Counter()
    for key in keys:
        parts = key.split(".")
        if len(parts) > depth:
            counts[".".join(parts[:depth]) + "."] += 1
    return [p for p, _ in counts.most_common(3)]


def candidate_fixes(ckpt_keys: list[str], model_keys: list[str]) -> list[KeyFix]:
    """Renames worth scoring, simplest first."""
    ckpt_components = {p for k in ckpt_keys for p in k.split(".")}
    model_components = {p for k in model_keys for p in k.split(".")}
    wrappers = tuple(c for c in WRAPPER_COMPONENTS if c in ckpt_components and c not in model_components)
    bases = [KeyFix()]
    if wrappers:
        bases += [KeyFix(wrappers, everywhere=False), KeyFix(wrappers, everywhere=True)]
    fixes = list(bases)
    for base in bases:
        renamed = [base.apply(k) for k in ckpt_keys]
        for depth in (1, 2):
            for prefix in _leading(renamed, depth):
                fixes.append(KeyFix(base.remove_components, base.everywhere, strip_prefix=prefix))
        renamed_leading = {k.split(".", 1)[0] for k in renamed}
        for depth in (1, 2):
            for prefix in _leading(model_keys, depth):
                if prefix.split(".", 1)[0] not in renamed_leading:
                    fixes.append(KeyFix(base.remove_components, base.everywhere, add_prefix=prefix))
                    for strip in _leading(renamed, 1):
                        fixes.append(
                            KeyFix(
                                base.remove_components, base.everywhere, strip_prefix=strip, add_prefix=prefix
                            )
                        )
    return fixes


def _score(fix: KeyFix, ckpt_keys: list[str], model_keys: set[str]) -> int:
    return sum(1 for k in ckpt_keys if fix.apply(k) in model_keys)


def compare_state_dicts(
    ckpt: dict[str, Entry],
    model: dict[str, Entry],
    *,
    tied: dict[str, str] | None = None,
    library: LibraryRename | None = None,
) -> FitReport:
    """Compare key sets, pick the best rename, then list what still differs (tied keys and the
    library's own rename handled as its loader does; see the module docstring)."""
    ckpt_keys, model_key_list = list(ckpt), list(model)
    model_keys = set(model_key_list)
    identity = _score(KeyFix(), ckpt_keys, model_keys)
    base = KeyFix(library=library)
    library_renamed = sum(1 for k in ckpt_keys if base.apply(k) != k) if library is not None else 0
    best, best_score = (
        (base, _score(base, ckpt_keys, model_keys)) if library_renamed else (KeyFix(), identity)
    )
    if best_score < min(len(ckpt_keys), len(model_keys)):
        library_keys = [base.apply(k) for k in ckpt_keys] if library_renamed else ckpt_keys
        for fix in candidate_fixes(library_keys, model_key_list):
            if library_renamed:
                fix = KeyFix(fix.remove_components, fix.everywhere, fix.strip_prefix, fix.add_prefix, library)
            score = _score(fix, ckpt_keys, model_keys)
            if score > best_score:
                best, best_score = fix, score
    report = FitReport(best, identity, best_score, len(ckpt_keys), len(model_keys))
    if best.library is not None:
        report.library, report.library_renamed = best.library.name, library_renamed
    renamed: dict[str, str] = {}
    for key in ckpt_keys:
        new = best.apply(key)
        if new in renamed:
            report.collisions.append(new)
        renamed[new] = key
    for new, old in renamed.items():
        if new not in model_keys:
            report.unexpected.append(old)
            continue
        (c_shape, c_dtype), (m_shape, m_dtype) = ckpt[old], model[new]
        entry = ShapeMismatch(new, old, list(c_shape), list(m_shape), c_dtype, m_dtype)
        if tuple(c_shape) != tuple(m_shape):
            report.shape_mismatches.append(entry)
        elif c_dtype != m_dtype:
            report.dtype_mismatches.append(entry)
    missing = [k for k in model_key_list if k not in renamed]
    groups: dict[str, set[str]] = {}
    for key, first in (tied or {}).items():
        groups.setdefault(first, {first}).add(key)
    group_of = {k: g for g in groups.values() for k in g}
    report.tied_missing = [k for k in missing if k in group_of and any(o in renamed for o in group_of[k])]
    report.missing = [k for k in missing if k not in set(report.tied_missing)]
    return report
