"""Which loader a key fit holds for, and the exact call for each (no torch here).

Use in the worker, after comparing the keys twice (with the library's own rename and without):

    calls = loader_calls(with_library, plain, library_keys=renames, hf=HFClass("Qwen2ForCausalLM",
                         "transformers", "model"), folder=None)

A state dict saved from `model.model` (keys without `model.`) fits a `Qwen2ForCausalLM` through
`Qwen2ForCausalLM.from_pretrained`, which adds the class's `base_model_prefix` to each key the
model holds only with it, but not through `model.load_state_dict`, which renames nothing. So each
loader gets its own verdict (`fits_as_is`, `fits` after the rename in `call`) and its exact call:

- load_state_dict: the wrapper rename (if any, fit.KeyFix.code) then `model.load_state_dict(...)`;
  when only from_pretrained's prefix rule makes the keys fit, the same per-key prefix rule written out;
- from_pretrained (transformers models only): `Cls.from_pretrained(folder)` for a model folder with
  config.json, else `Cls.from_pretrained(None, config=model.config, state_dict=state_dict)`.

Known limitations: when from_pretrained's other renames (registered renamings, gamma/beta) are what
make the keys fit, no load_state_dict call is written (call is null): use from_pretrained.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_skills.checkpoint.fit import FitReport
from torch_skills.checkpoint.models import LoaderCall


@dataclass(frozen=True)
class HFClass:
    """A transformers model class, named from the user's own model object (not from the file)."""

    name: str  # "Qwen2ForCausalLM"
    module: str  # where to import it from: "transformers" when exported there
    base_model_prefix: str  # "model"; "" when the class has none


def prefix_rule(library_keys: dict[str, str], prefix: str) -> str | None:
    """'add' or 'strip' when every key the library renamed only gained or lost `prefix.`; else None."""
    if not prefix:
        return None
    head = prefix + "."
    kinds = set()
    for old, new in library_keys.items():
        if new == old:
            continue
        if new == head + old:
            kinds.add("add")
        elif old == head + new:
            kinds.add("strip")
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None


def _prefix_code(rule: str, prefix: str) -> str:
    head = prefix + "."
    if rule == "add":
        pick = f'(k if k in own else "{head}" + k)'
    else:
        pick = f'(k.removeprefix("{head}") if k.removeprefix("{head}") in own else k)'
    return (
        "own = model.state_dict().keys()\n"
        f"state_dict = {{{pick}: v for k, v in state_dict.items()}}\n"
        "model.load_state_dict(state_dict)"
    )


def _load_call(report: FitReport) -> str:
    strict = ", strict=False  # tied keys: one of each group is enough" if report.tied_missing else ""
    load = f"model.load_state_dict(state_dict{strict})"
    code = report.fix.code()
    return f"{code}\n{load}" if code else load


def loader_calls(
    with_library: FitReport,
    plain: FitReport,
    *,
    library_keys: dict[str, str],
    hf: HFClass | None,
    folder: str | None,
) -> list[LoaderCall]:
    """One LoaderCall per loader that applies (see the module docstring).

    `with_library`: the comparison with the library's rename (the same as `plain` for non-library
    models); `library_keys`: checkpoint key -> the key after the library's rename; `folder`: the
    model folder (with config.json) when the checkpoint is one, else None."""
    plain_call = LoaderCall(
        loader="load_state_dict",
        fits_as_is=plain.fits and plain.fix.is_identity,
        fits=plain.fits,
        call=_load_call(plain) if plain.fits else None,
    )
    if hf is None:
        return [plain_call]
    if not plain.fits and with_library.fits and with_library.fix.is_identity:
        rule = prefix_rule(library_keys, hf.base_model_prefix)
        if rule is not None:
            plain_call.fits, plain_call.call = True, _prefix_code(rule, hf.base_model_prefix)
    load_cls = f"from {hf.module} import {hf.name}\n"
    if folder is not None and with_library.fix.is_identity:
        call = f"{load_cls}model = {hf.name}.from_pretrained({folder!r})"
    else:
        rename = with_library.fix.code()  # the wrapper part; from_pretrained does its own
        call = (
            (f"{rename}\n" if rename else "")
            + load_cls
            + f"model = {hf.name}.from_pretrained(None, config=model.config, state_dict=state_dict)"
        )
    library_call = LoaderCall(
        loader="from_pretrained",
        fits_as_is=with_library.fits and with_library.fix.is_identity,
        fits=with_library.fits,
        call=call if with_library.fits else None,
    )
    return [plain_call, library_call]
