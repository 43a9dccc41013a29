"""Findings and the one-paragraph summary of a verify_checkpoint result (no torch here).

Use `findings = build_findings(result)` then `summary = build_summary(result)` on a
VerifyCheckpointResult whose facts are filled in; each finding names the skill to read next.
"""

from __future__ import annotations

import re
from collections import defaultdict

from torch_skills.checkpoint.adapter import severity as adapter_severity
from torch_skills.checkpoint.filetext import prose_name, shown_global
from torch_skills.checkpoint.models import VerifyCheckpointResult
from torch_skills.checkpoint.verdict import CORRUPT_CODES
from torch_skills.results import Finding, format_bytes

SKILL = "checkpointing-and-reproducibility"

MISSING_EFFECT = {
    "model": "no model weights were found",
    "optimizer": "optimizer state (momentum, Adam moments) restarts from zero, which shows as a loss spike after resuming",
    "scheduler": "the learning-rate schedule restarts from its first step",
    "grad_scaler": "float16 AMP restarts its loss scale and skips steps until it recalibrates (irrelevant without float16 autocast)",
    "epoch_or_step": "the training loop cannot tell where it stopped",
    "rng_torch": "dropout and augmentation draw different numbers than an uninterrupted run would",
    "rng_cuda": "GPU-side randomness (dropout on CUDA) differs (irrelevant for CPU-only training)",
    "rng_numpy": "numpy-based shuffling or augmentation differs",
    "rng_python": "random-module shuffling or augmentation differs",
    "sampler": "the data order restarts: batches already seen this epoch are seen again",
}
_MAJOR_MISSING = ("model", "optimizer", "epoch_or_step")


RISK_TEXT = {
    "code_execution": "it can run code or reach the system when the file is loaded",
    "data": "a plain data class this scan's policy does not allow",
    "unknown": "it is not in the weights_only allowlist, so torch.load(weights_only=True) refuses it",
}
# what a structural problem means, in the tool's own words (the problem's message may quote the file)
PROBLEM_ADVICE = {
    "torchscript_archive": "a TorchScript archive: torch.jit.load compiles and runs its code/ files, and "
    "torch.load(weights_only=True) refuses it; load it only from a trusted source",
    "python_code_in_folder": "Python code beside the weights: transformers runs it only with "
    "trust_remote_code=True; read it before enabling that",
    "outside_checked_folder": "a file this checkpoint points to resolves outside the checked folder or the allowed "
    "roots (a link or a '..' path); it was refused, not read",
    "link_outside_folder": "a symbolic link leads outside the checked folder; it was not followed or read",
    "index_missing_shard": "the index names a shard that is missing; loading will fail",
    "data_files": "some files hold no pickle, archive or tensor format; every file was sniffed, and these are "
    "plain data to any loader",
    "pickle_frame_ambiguous": "a pickle built so that different unpicklers read different opcodes; treat it as "
    "hostile",
    "zip_parser_disagreement": "torch's zip reader and the scan's reader see different contents: the file is "
    "built to show scanners one thing and the loader another",
    "loader_refused": "the format's own loader refused the file, so it is not called safe",
    "tensor_data_unreadable": "tensor bytes the headers promise are not in the file: it is truncated or damaged; "
    "re-download or re-save it",
}


def _problem_advice(code: str, blocks_safe: bool, corrupt: bool) -> str:
    if code in PROBLEM_ADVICE:
        return PROBLEM_ADVICE[code]
    if blocks_safe and corrupt:
        return f"{code}: the file is corrupt or truncated, so it cannot be verified or loaded; re-download or re-save it"
    if blocks_safe:
        return (
            f"{code}: a hostile or unverifiable structure; do not open this file with pickle or "
            "torch.load(weights_only=False)"
        )
    return f"{code}: worth knowing; it does not make the file unsafe"


def _global_in_prose(u, index: int) -> str:
    shown = shown_global(u.qualified)
    if shown is not None:
        return shown
    if u.qualified is None:
        return f"an unresolvable {u.opcode}"
    return f"a global whose name is file text (unsafe_globals[{index}].qualified)"


def _unsafe_findings(r: VerifyCheckpointResult) -> list[Finding]:
    by_name: dict[str, list] = defaultdict(list)
    first_index: dict[str, int] = {}
    for i, u in enumerate(r.unsafe_globals):
        key = u.qualified or f"unresolvable {u.opcode}"
        by_name[key].append(u)
        first_index.setdefault(key, i)
    out = []
    for name, refs in list(by_name.items())[:10]:
        first, index = refs[0], first_index[name]
        called = f", called at offset {first.called_at}" if first.called_at is not None else ""
        out.append(
            Finding(
                severity="error",
                code="unsafe_global",
                message=(
                    f"{_global_in_prose(first, index)} at offset {first.offset}{called} ({len(refs)}x; where: "
                    f"unsafe_globals[{index}].source): {RISK_TEXT[first.risk]}. "
                    + (
                        "Do not open this file with pickle or torch.load(weights_only=False); get the weights as "
                        "safetensors or re-export them from a trusted copy."
                        if first.risk != "data"
                        else "It only holds data; allow it with torch.serialization.safe_globals if you trust the "
                        "class's module."
                    )
                ),
                skill=SKILL,
            )
        )
    hidden = r.unsafe_global_count - sum(len(v) for v in list(by_name.values())[:10])
    if hidden > 0:
        out.append(
            Finding(
                severity="error",
                code="unsafe_global",
                message=f"{hidden} more unsafe references are not listed.",
                skill=SKILL,
            )
        )
    return out


def _resume_findings(r: VerifyCheckpointResult) -> list[Finding]:
    out = []
    if r.resume is None:
        return out
    taken = ", ".join(x.role for x in r.resume.roles) + " (their keys in resume.roles)"
    if r.resume.kind == "training" and r.missing_for_resume:
        major = [m for m in r.missing_for_resume if m in _MAJOR_MISSING]
        effects = "; ".join(f"{m}: {MISSING_EFFECT[m]}" for m in r.missing_for_resume)
        out.append(
            Finding(
                severity="warning" if major or len(r.missing_for_resume) > 3 else "info",
                code="missing_for_resume",
                message=(
                    f"resuming from this checkpoint will not continue the run exactly. Missing {effects}. "
                    f"Found: {taken}. Save these with the rest (state_dict() of each object, "
                    "torch.get_rng_state(), torch.cuda.get_rng_state_all(), np.random.get_state(), random.getstate())."
                ),
                skill=SKILL,
            )
        )
    elif r.resume.kind == "weights_only":
        out.append(
            Finding(
                severity="info",
                code="weights_only_checkpoint",
                message=(
                    "weights only: fine for inference or fine-tuning, but resuming training would also need "
                    + ", ".join(m for m in r.missing_for_resume if m != "model")
                    + "."
                ),
                skill=SKILL,
            )
        )
    elif r.resume.kind == "unknown" and r.loaded:
        out.append(
            Finding(
                severity="info",
                code="no_model_weights_found",
                message="no model state dict was recognised (no tensor mapping under a known key).",
                skill=SKILL,
            )
        )
    return out


_HF_WEIGHTS = re.compile(r"(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?")
LOADER_WORDS = {
    "load_state_dict": "plain model.load_state_dict",
    "from_pretrained": "transformers' from_pretrained (it adds or strips the class's base_model_prefix and "
    "applies its own key renames)",
}


def _loader_findings(r: VerifyCheckpointResult) -> list[Finding]:
    """When the fit holds through one loader and not as is through another: say which, with both calls."""
    k = r.key_mismatch
    if k is None or not k.fits or len(k.loaders) < 2:
        return []
    as_is = [c for c in k.loaders if c.fits_as_is]
    other = [c for c in k.loaders if not c.fits_as_is]
    if not as_is or not other:
        return []
    lines = [f"the keys fit as they are only through {LOADER_WORDS[as_is[0].loader]}, not through "]
    lines[0] += " or ".join(LOADER_WORDS[c.loader].split(" (")[0] for c in other) + "."
    if k.prefix_fix is None:  # the calls quote only the model's class and prefix and your path: no file text
        for c in [*as_is, *other]:
            if c.call:
                lines.append(f"With {c.loader}:\n{c.call}")
            else:
                lines.append(f"{c.loader}: no rename the tool knows makes it fit; use the other loader.")
    else:
        lines.append("The exact call for each is in key_mismatch.loaders[].call.")
    # a save_pretrained file is loaded with from_pretrained as a rule: then the note is for information
    hf_file = r.layout == "huggingface_model" or _HF_WEIGHTS.match(
        r.path.replace("\\", "/").rsplit("/", 1)[-1]
    )
    expected = hf_file and as_is[0].loader == "from_pretrained"
    return [
        Finding(
            severity="info" if expected else "warning",
            code="fit_depends_on_loader",
            message="\n".join(lines),
            skill=SKILL,
        )
    ]


ADAPTER_PROBLEM_WORDS = {
    "targets_not_in_base": "adapter_config.json's target_modules select no module of "
    "the base model, so PeftModel.from_pretrained raises ValueError: the adapter was made for another "
    "architecture, or this is not the base model it was trained on",
    "module_not_in_base": "{n} modules the adapter holds LoRA weights for do not exist in the base model (names "
    "in adapter.problems): it was trained on a different base (more layers or other module names); PEFT drops "
    "those weights",
    "rank_mismatch": "{n} modules' LoRA matrices have a rank other than the r={r} (or rank_pattern) of "
    "adapter_config.json (first: {first}): loading fails with a size mismatch; the config and the weights come "
    "from different runs, so set r / rank_pattern to the weights' rank",
    "in_features_mismatch": "{n} modules' lora_A input size differs from the base layer's (first: {first}): the "
    "adapter was trained on a different base model (another size or variant); load it onto that one",
    "out_features_mismatch": "{n} modules' lora_B output size differs from the base layer's (first: {first}): the "
    "adapter was trained on a different base model (another size or variant); load it onto that one",
    "not_targeted": "{n} modules have LoRA weights but target_modules does not select them (first: {first}): "
    "PEFT builds no LoRA layer there and drops the weights",
    "no_adapter_weights": "{n} modules target_modules selects have no LoRA weights in the file (first: {first}): "
    "PEFT leaves them at its initialisation (lora_B is zero), so the adapter changes nothing there",
    "saved_module_shape": "{n} saved tensors (modules_to_save) differ in shape from the base model's (first: "
    "{first}): loading fails with a size mismatch",
    "unsupported_layer": "{n} modules with LoRA weights or selected by target_modules are not layer types LoRA "
    "wraps (Linear, Embedding, ConvNd, Conv1D) (first: {first})",
    "unrecognised_key": "{n} adapter keys name neither a LoRA matrix nor a tensor of the base model (names in "
    "adapter.problems): PEFT drops them",
}
_FILE_NAMED = ("module_not_in_base", "unrecognised_key", "targets_not_in_base")  # their module is file text


def _adapter_findings(r: VerifyCheckpointResult) -> list[Finding]:
    a = r.adapter
    if a is None:
        return []
    call = a.loader.call or ""
    if a.config_error:
        return [
            Finding(
                severity="error",
                code="adapter_config_unusable",
                message=f"a PEFT adapter folder whose config cannot be used: {a.config_error}. PEFT reads the same "
                "file, so PeftModel.from_pretrained cannot load it either.",
                skill=SKILL,
            )
        ]
    if not a.modelled:
        return [
            Finding(
                severity="info",
                code="adapter_not_modelled",
                message="a PEFT adapter of a type other than LoRA (adapter.peft_type): its keys were not compared "
                f"with the base model. Load it as PEFT does:\n{call}",
                skill=SKILL,
            )
        ]
    out = []
    by_code: dict[str, list] = defaultdict(list)
    for p in a.problems:
        by_code[p.code].append(p)
    for code, items in by_code.items():
        p = items[0]
        first = f"{p.module}: {p.adapter_shape} in the adapter, PEFT builds {p.expected_shape}"
        if p.adapter_shape is None or p.expected_shape is None:
            first = p.module
        if code in _FILE_NAMED:
            first = "adapter.problems"
        n = len(items)  # of the problems listed (adapter.problem_count counts them all)
        out.append(
            Finding(
                severity=adapter_severity(code),
                code=f"adapter_{code}",
                message=ADAPTER_PROBLEM_WORDS[code].format(n=n, r=a.r, first=first) + ".",
                skill=SKILL,
            )
        )
    if a.fits:
        saved = f" and {a.saved_tensors} saved tensor(s) (modules_to_save)" if a.saved_tensors else ""
        out.insert(
            0,
            Finding(
                severity="info",
                code="adapter_fits",
                message=f"a PEFT LoRA adapter (r={a.r}) for {a.lora_modules} modules of the base model{saved}: it "
                "fits the base model as PEFT loads it (adapter name 'default' inserted). Load it with:\n"
                f"{call}",
                skill=SKILL,
            ),
        )
    return out


def _fit_findings(r: VerifyCheckpointResult) -> list[Finding]:
    out = _adapter_findings(r) + _loader_findings(r)
    k = r.key_mismatch
    if k is None:
        return out
    if k.prefix_fix is not None:
        fix = k.prefix_fix
        words = [*fix.remove_components, *fix.strip_prefix.strip(".").split(".")]
        if all(w == "" or prose_name(w) for w in words):
            plain = next((c for c in k.loaders if c.loader == "load_state_dict"), None)
            before = (
                "Before load_state_dict"
                if plain is None or plain.fits
                else "Then load with from_pretrained (key_mismatch.loaders; plain load_state_dict would also need "
                "the library's renames). Before it"
            )
            how = f"{fix.description} ({k.matched_as_is} of {k.model_keys} keys match as is, {k.matched} after). {before}:\n{fix.code}"
        else:
            how = (
                f"{k.matched_as_is} of {k.model_keys} keys match as is, {k.matched} after the rename in "
                "key_mismatch.prefix_fix.code (it quotes key prefixes from the file: read it before running it)"
            )
        out.append(
            Finding(
                severity="warning",
                code="key_prefix_mismatch",
                message=f"the checkpoint's keys need renaming to fit the model: {how}",
                skill=SKILL,
            )
        )
    if k.missing_count:
        out.append(
            Finding(
                severity="error",
                code="missing_keys",
                message=f"{k.missing_count} model keys are not in the checkpoint (e.g. {', '.join(k.missing[:3])}); "
                "strict loading fails and strict=False would leave them at their initial values.",
                skill=SKILL,
            )
        )
    if k.unexpected_count:
        out.append(
            Finding(
                severity="warning",
                code="unexpected_keys",
                message=f"{k.unexpected_count} checkpoint keys have no place in the model (names in "
                "key_mismatch.unexpected); strict loading fails on them.",
                skill=SKILL,
            )
        )
    if k.shape_mismatches:
        s = k.shape_mismatches[0]
        out.append(
            Finding(
                severity="error",
                code="shape_mismatch",
                message=f"{len(k.shape_mismatches)} tensors differ in shape (first: {s.key} is {s.checkpoint_shape} "
                f"in the checkpoint, {s.model_shape} in the model): a different model configuration.",
                skill=SKILL,
            )
        )
    if k.dtype_mismatches:
        s = k.dtype_mismatches[0]
        out.append(
            Finding(
                severity="info",
                code="dtype_mismatch",
                message=f"{len(k.dtype_mismatches)} tensors differ in dtype (first: {s.key} {s.checkpoint_dtype} vs "
                f"{s.model_dtype}); load_state_dict casts them.",
                skill=SKILL,
            )
        )
    return out


RESAVE = (
    "    model = torch.load(path, weights_only=False)  # only for a file you made yourself\n"
    '    torch.save(model.state_dict(), "weights.pt")  # then load_state_dict(torch.load("weights.pt"))'
)


def _own_classes_finding(own: list[str]) -> Finding:
    return Finding(
        severity="warning",
        code="own_classes_only",
        message=(
            f"a whole pickled model: besides torch's own layer classes it references only classes defined in "
            f"files under your roots ({'; '.join(own[:6])}), which is what torch.save(model) writes. Loading it "
            "imports and runs those classes' code, so torch.load(weights_only=False) is only for a file you made "
            "yourself, never one you were sent or downloaded. Re-save it once as a state_dict:\n" + RESAVE
        ),
        skill=SKILL,
    )


def build_findings(r: VerifyCheckpointResult, own_classes: list[str] | None = None) -> list[Finding]:
    """Findings of `r`; `own_classes` (worker.own_classes) replaces the unsafe-global wording."""
    out = [_own_classes_finding(own_classes)] if own_classes else _unsafe_findings(r)
    for i, p in enumerate(r.problems):
        advice = _problem_advice(p.code, p.blocks_safe, p.code in CORRUPT_CODES)
        out.append(
            Finding(
                severity=p.severity if not p.blocks_safe else "error",
                code=p.code,
                message=f"{advice} (details, quoting the file's names: problems[{i}]).",
                skill=SKILL,
            )
        )
    if not r.safe:
        out.append(
            Finding(
                severity="info",
                code="not_loaded",
                message="contents were not read: the file is unsafe or cannot be verified, and nothing in it was "
                "unpickled or executed.",
                skill=SKILL,
            )
        )
    if r.needs_safe_globals:
        names = ", ".join(r.needs_safe_globals)
        recipe = f" Load it with:\n{r.allowlist_recipe}" if r.allowlist_recipe else ""
        out.append(
            Finding(
                severity="info",
                code="needs_safe_globals",
                message=f"safe to load with an allowlist: the file uses plain data classes ({names}) that "
                "torch.load(weights_only=True) refuses unless they are passed to torch.serialization.safe_globals "
                "(numpy arrays also need the numpy.dtypes class of each dtype)." + recipe,
                skill=SKILL,
            )
        )
    if r.format in ("huggingface", "directory", "dcp") and not r.safe:
        usable = [f.name for f in r.files if f.verdict in ("safe", "safe_with_allowlist")]
        bad = [f.name for f in r.files if f.verdict in ("unsafe", "corrupt")]
        if usable and bad:
            out.append(
                Finding(
                    severity="info",
                    code="usable_files",
                    message=f"{len(usable)} files of this folder are safe on their own and can be loaded one by one "
                    f"(files[] with verdict safe); the problem is in {len(bad)} others (verdict unsafe or corrupt).",
                    skill=SKILL,
                )
            )
    if r.load_error:
        out.append(
            Finding(
                severity="error",
                code="load_failed",
                message="the format's own loader refused the file; its message, which may quote the file, is in "
                "load_error.",
                skill=SKILL,
            )
        )
    if r.format == "torch_legacy":
        out.append(
            Finding(
                severity="info",
                code="legacy_format",
                message="legacy (pre-1.6) torch format: it cannot be memory-mapped; re-save it with torch.save.",
                skill=SKILL,
            )
        )
    if r.nonfinite_tensors:
        worst = ", ".join(f"{t.nan} NaN and {t.inf} Inf" for t in r.nonfinite_tensors[:3])
        out.append(
            Finding(
                severity="error",
                code="nonfinite_tensors",
                message=f"{len(r.nonfinite_tensors)} tensors hold NaN/Inf ({worst}; names in nonfinite_tensors). Training had diverged before this "
                "save; resume from an earlier checkpoint and find where the values first went non-finite.",
                skill="debugging-techniques",
            )
        )
    out += _resume_findings(r)
    for i, opt in enumerate(r.optimizers):
        for problem in opt.problems:
            out.append(
                Finding(
                    severity="error" if opt.shape_mismatches or opt.duplicate_params else "warning",
                    code="optimizer_inconsistent",
                    message=f"optimizers[{i}]: {problem}.",
                    skill=SKILL,
                )
            )
    out += _fit_findings(r)
    lr = r.load_and_run
    if lr is not None:
        if lr.error:
            out.append(Finding(severity="error", code="load_and_run_failed", message=lr.error, skill=SKILL))
        else:
            out.append(
                Finding(
                    severity="info",
                    code="load_and_run_ok",
                    message=f"{'PeftModel.from_pretrained' if lr.loader == 'peft_from_pretrained' else 'strict load'}"
                    f" and one forward ({lr.mode} mode) succeeded; output shapes "
                    f"{lr.output_shapes}, finite={lr.output_finite}.",
                    skill=SKILL,
                )
            )
    return out


def build_summary(r: VerifyCheckpointResult, own_classes: list[str] | None = None) -> str:
    if own_classes:
        return (
            f"A whole pickled model of your own classes ({len(own_classes)}) and torch layers, not loaded: loading "
            "runs their code. weights_only=False is only for a file you made; re-save it as a state_dict "
            "(finding own_classes_only)."
        )
    if not r.safe:
        names = sorted({n for u in r.unsafe_globals if (n := shown_global(u.qualified))})
        unnamed = len({u.qualified for u in r.unsafe_globals if not shown_global(u.qualified)})
        if r.verdict == "corrupt":
            parts = [
                f"CORRUPT/unreadable {r.format} checkpoint: nothing hostile found, but it cannot be verified or loaded."
            ]
        else:
            parts = [f"UNSAFE {r.format} checkpoint, not loaded."]
        if r.unsafe_global_count:
            listed = names[:5] + ([f"{unnamed} more named in unsafe_globals"] if unnamed else [])
            parts.append(f"{r.unsafe_global_count} unsafe references: {', '.join(listed)}.")
        blocking = [p for p in r.problems if p.blocks_safe]
        if blocking:
            parts.append(
                f"{len(blocking)} structural problems ({', '.join(sorted({p.code for p in blocking})[:4])})."
            )
        usable = [f.name for f in r.files if f.verdict in ("safe", "safe_with_allowlist")]
        if usable and len(usable) < len(r.files):
            parts.append(f"{len(usable)} of {len(r.files)} files are safe on their own (files[].verdict).")
        return " ".join(parts)
    if r.verdict == "safe_with_allowlist":
        parts = [
            f"Safe to load with an allowlist: {r.format} ({r.layout}) uses {len(r.needs_safe_globals)} plain data "
            "classes weights_only refuses by default (recipe in allowlist_recipe)."
        ]
    else:
        parts = [f"Safe {r.format} ({r.layout})."]
    if r.tensors is not None:
        parts.append(f"{r.tensors.count} tensors, {format_bytes(r.tensors.total_bytes)}.")
    if r.load_error:
        parts.append("Not loaded: the loader refused it (load_error).")
    if r.nonfinite_tensors:
        parts.append(f"{len(r.nonfinite_tensors)} tensors hold NaN/Inf.")
    elif r.nonfinite_scanned:
        parts.append("No NaN/Inf.")
    if r.resume is not None and r.resume.kind == "training":
        parts.append(
            "Complete for resuming."
            if not r.missing_for_resume
            else f"Missing for resume: {', '.join(r.missing_for_resume)}."
        )
    elif r.resume is not None and r.resume.kind == "weights_only":
        parts.append("Weights only.")
    if any(not o.consistent for o in r.optimizers):
        parts.append("Optimizer state inconsistent.")
    a = r.adapter
    if r.layout == "peft_adapter" and a is None:
        parts.append(
            "A PEFT adapter: pass its base model as model= to check the fit; load it with "
            "PeftModel.from_pretrained(base_model, folder)."
        )
    elif a is not None and a.fits:
        parts.append(
            f"A PEFT LoRA adapter for {a.lora_modules} modules: fits the base model as PEFT loads it "
            "(adapter.loader.call)."
        )
    elif a is not None and a.modelled:
        codes = ", ".join(sorted({p.code for p in a.problems if adapter_severity(p.code) == "error"}))
        parts.append(f"A PEFT LoRA adapter that does not fit the base model as PEFT loads it: {codes}.")
    elif a is not None:
        parts.append("A PEFT adapter whose fit was not checked (see findings).")
    k = r.key_mismatch
    if k is not None:
        if k.fits:
            fix = " after the rename in key_mismatch.prefix_fix" if k.prefix_fix else ""
            only = [c.loader for c in k.loaders if c.fits_as_is]
            if len(k.loaders) > 1 and len(only) == 1:
                fix += f" through {only[0]} as is (key_mismatch.loaders has the call for each loader)"
            parts.append(f"Fits the model{fix}.")
        else:
            parts.append(
                f"Does not fit the model: {k.missing_count} missing, {k.unexpected_count} unexpected, "
                f"{len(k.shape_mismatches)} shape mismatches."
            )
    if r.load_and_run is not None:
        parts.append("load_and_run ok." if not r.load_and_run.error else "load_and_run failed.")
    return " ".join(parts)
