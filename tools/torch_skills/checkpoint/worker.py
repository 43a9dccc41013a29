"""verify_checkpoint in the worker: scan statically, load only if safe, then check contents and fit.

Called by the runner as `torch_skills.checkpoint.worker:run(request, job)`; see tools/checkpoint/scan.py
(static safety), load.py (opening safe files), contents.py (tensors, NaN/Inf), resume.py
(completeness, optimizer consistency) and fit.py (keys against a model).

Order matters: nothing from the file is unpickled before the static scan says it is safe, and
the user's model factory (their own code) runs only after that, in this same sandboxed child.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import Any

import torch

from torch_skills.checkpoint.adapter import check_adapter
from torch_skills.checkpoint.adapter_config import (
    AdapterConfigError,
    adapter_config_path,
    read_adapter_config,
)
from torch_skills.checkpoint.allowlist import Policy
from torch_skills.checkpoint.confine import Confinement
from torch_skills.checkpoint.contents import find_nonfinite, summarize_tensors
from torch_skills.checkpoint.filetext import wire_safe_result
from torch_skills.checkpoint.fit import FitReport, compare_state_dicts
from torch_skills.checkpoint.load import CheckpointLoadError, LoadedCheckpoint, load_checkpoint
from torch_skills.checkpoint.loaders import HFClass, loader_calls
from torch_skills.checkpoint.modelkeys import ModelKeys, base_entries, is_peft_model, layer_shapes, model_keys
from torch_skills.checkpoint.models import (
    AdapterCheck,
    FileProblem,
    KeyMismatch,
    LoadAndRun,
    LoaderCall,
    PrefixFix,
    ResumeCheck,
    ShapeMismatchInfo,
    VerifyCheckpointRequest,
    VerifyCheckpointResult,
)
from torch_skills.checkpoint.report import SKILL, build_findings, build_summary
from torch_skills.checkpoint.resume import file_role, find_resume_roles, get_path, optimizer_checks
from torch_skills.checkpoint.scan import StaticScan, scan_path
from torch_skills.checkpoint.static import (
    LOADER_REFUSED,
    import_roots,
    not_safe,
    own_classes,
    resolve_checkpoint_path,
    static_facts,
)
from torch_skills.checkpoint.tree import TensorMeta, is_tensor_mapping, leaf_info, walk
from torch_skills.results import Finding
from torch_skills.runner.child import JobContext
from torch_skills.runner.usercode import (
    build_model,
    call_model,
    describe_rule,
    make_batch,
    resolve_device,
    to_device,
    user_code,
)

_LIGHTNING_KEYS = ("pytorch-lightning_version", "optimizer_states")


def _layout(
    scan: StaticScan, loaded: LoadedCheckpoint | None, resume: ResumeCheck | None, adapter: bool
) -> str:
    if loaded is None or loaded.obj is None:
        return "not_loaded"
    if scan.format == "dcp":
        return "dcp"
    obj = loaded.obj
    if loaded.folder:
        names = set(obj) if isinstance(obj, Mapping) else set()
        trainer = {"optimizer.pt", "scheduler.pt", "trainer_state.json"} & names
        if trainer:  # a Trainer checkpoint of a PEFT run also holds the adapter: checked as one all the same
            return "huggingface_trainer"
        return "peft_adapter" if adapter else "huggingface_model"
    if adapter:  # adapter_model.safetensors named on its own, its config beside it
        return "peft_adapter"
    if leaf_info(obj) is not None:
        return "tensor"
    if is_tensor_mapping(obj):
        return "state_dict"
    if isinstance(obj, Mapping) and any(k in obj for k in _LIGHTNING_KEYS):
        return "lightning"
    if resume is not None and resume.kind == "training":
        return "training_checkpoint"
    return "other"


def _checkpoint_model_state(
    loaded: LoadedCheckpoint, resume: ResumeCheck
) -> tuple[str, dict[str, Any]] | None:
    """(description, {key: leaf}) of the checkpoint's model weights, or None when there are none."""
    role = next((r for r in resume.roles if r.role == "model"), None)
    if role is None:
        return None
    if loaded.folder and role.matched_by == "file":
        models = [name for name in loaded.obj if file_role(name) == (True, "model")]
        merged: dict[str, Any] = {}
        for name in models:
            value = loaded.obj.get(name)
            if isinstance(value, Mapping):
                merged.update(dict(walk(value)))
        return ", ".join(models), merged
    value = get_path(loaded.obj, role.key)
    if not isinstance(value, Mapping):
        return None
    return role.key, dict(walk(value))


def _key_mismatch(
    compared: str, report: FitReport, max_listed: int, loaders: list[LoaderCall] | None = None
) -> KeyMismatch:
    fix = report.fix
    prefix = None
    if not fix.is_identity:
        prefix = PrefixFix(
            description=fix.describe(),
            remove_components=list(fix.remove_components),
            at_every_depth=fix.everywhere,
            strip_prefix=fix.strip_prefix,
            add_prefix=fix.add_prefix,
            code=fix.code(),
        )

    def info(items) -> list[ShapeMismatchInfo]:
        return [ShapeMismatchInfo(**vars(m)) for m in items[:max_listed]]

    return KeyMismatch(
        compared=compared,
        checkpoint_keys=report.checkpoint_keys,
        model_keys=report.model_keys,
        matched_as_is=report.matched_before,
        matched=report.matched,
        prefix_fix=prefix,
        missing=report.missing[:max_listed],
        missing_count=len(report.missing),
        unexpected=report.unexpected[:max_listed],
        unexpected_count=len(report.unexpected),
        shape_mismatches=info(report.shape_mismatches),
        dtype_mismatches=info(report.dtype_mismatches),
        fits=report.fits,
        tied_missing=report.tied_missing[:max_listed],
        library_rename=report.library,
        library_renamed=report.library_renamed,
        loaders=loaders or [],
    )


def _hf_class(model: torch.nn.Module) -> HFClass:
    """How to import the user's transformers model class (named from their object, never the file)."""
    cls = type(model)
    try:
        import transformers

        module = "transformers" if getattr(transformers, cls.__name__, None) is cls else cls.__module__
    except ImportError:
        module = cls.__module__
    return HFClass(cls.__name__, module, getattr(model, "base_model_prefix", "") or "")


def _compare(
    path: Any, loaded: LoadedCheckpoint, compared: str, shapes: dict, keys: ModelKeys, model, max_listed: int
) -> tuple[KeyMismatch, FitReport]:
    """The key comparison with the library's renames, and the verdict and call per loader."""
    report = compare_state_dicts(shapes, keys.entries, tied=keys.tied, library=keys.library)
    if keys.library is None:
        return _key_mismatch(
            compared, report, max_listed, loader_calls(report, report, library_keys={}, hf=None, folder=None)
        ), report
    plain = compare_state_dicts(shapes, keys.entries, tied=keys.tied)
    renames = {k: keys.library.rename(k) for k in shapes}
    folder = str(path) if loaded.folder and (path / "config.json").is_file() else None
    calls = loader_calls(report, plain, library_keys=renames, hf=_hf_class(model), folder=folder)
    return _key_mismatch(compared, report, max_listed, calls), report


def _adapter_check(
    config_path: Any, folder: Any, entries: dict[str, Any], model: torch.nn.Module, max_listed: int
) -> AdapterCheck:
    """The adapter's fit to the base model as PEFT loads it (checkpoint.adapter)."""
    shapes = {k: (info.shape, info.dtype) for k, v in entries.items() if (info := leaf_info(v)) is not None}
    base = base_entries(model)
    try:
        config = read_adapter_config(config_path)
    except AdapterConfigError as e:
        loader = LoaderCall(loader="peft_from_pretrained", fits_as_is=False, fits=False, call=None)
        return AdapterCheck.not_modelled("", loader, config_error=str(e))
    return check_adapter(config, shapes, layer_shapes(model), base, folder=str(folder), max_listed=max_listed)


def _load_adapter(folder: Any, model: torch.nn.Module) -> torch.nn.Module:
    """The user's base model with the adapter, loaded by PEFT itself: PeftModel.from_pretrained(model, folder),
    or, when the factory already returns a PeftModel, its load_adapter under a fresh name."""
    try:
        from peft import PeftModel
    except ImportError:
        raise RuntimeError(
            "peft is not installed in the interpreter that runs your model: install it (pip install peft) to "
            "load the adapter"
        ) from None
    if is_peft_model(model):
        model.load_adapter(str(folder), adapter_name="checked")
        model.set_adapter("checked")
        return model
    return PeftModel.from_pretrained(model, str(folder))


def _materialize(leaf: Any) -> torch.Tensor:
    if isinstance(leaf, TensorMeta):
        if leaf.read is None:
            raise CheckpointLoadError(f"{leaf.source} cannot be read")
        return leaf.read()
    if isinstance(leaf, torch.Tensor):
        return leaf
    return torch.from_numpy(leaf)


def _error_text(phase: str, exc: BaseException) -> str:
    tail = "".join(traceback.format_exception(exc)[-3:]).strip()
    return f"{phase} raised {type(exc).__name__}: {str(exc)[:1200]}\n{tail[-1500:]}"


def _load_and_run(
    request: VerifyCheckpointRequest,
    job: JobContext,
    model: torch.nn.Module,
    state: dict[str, Any],
    report: FitReport | None,
    adapter_folder: Any = None,
) -> LoadAndRun:
    """Load the weights (load_state_dict after the fit's renames, or PEFT for an adapter folder), run one forward."""
    result = LoadAndRun(
        loaded=False,
        prefix_fix_applied=report is not None and not report.fix.is_identity,
        error=None,
        forward_ran=False,
        output_shapes=[],
        output_finite=None,
        loader="peft_from_pretrained" if report is None else "load_state_dict",
    )
    if report is None:
        try:
            model = _load_adapter(adapter_folder, model)
            result.loaded = True
        except Exception as e:  # PEFT's refusal is the finding, not a tool failure
            result.error = _error_text("PeftModel.from_pretrained(base_model, folder)", e)
            return result
        return _forward(request, job, model, result)
    try:
        renamed = {report.fix.apply(k): _materialize(v) for k, v in state.items()}
    except Exception as e:  # a DCP item or safetensors range that cannot be read back
        result.error = _error_text("reading the checkpoint's weights", e)
        return result
    try:
        if report.tied_missing:  # one tensor of each tied group is enough: load the rest non-strictly
            result.strict = False
            outcome = model.load_state_dict(renamed, strict=False)
            left = sorted(set(outcome.missing_keys) - set(report.tied_missing)) + list(
                outcome.unexpected_keys
            )
            if left:
                raise RuntimeError(f"keys still missing or unexpected: {', '.join(left[:10])}")
        else:
            model.load_state_dict(renamed, strict=True)
        result.loaded = True
    except Exception as e:  # strict-load errors are the finding, not a tool failure
        how = "strict=False, tied keys excepted" if not result.strict else "strict=True"
        result.error = _error_text(f"model.load_state_dict({how})", e)
        return result
    return _forward(request, job, model, result)


def _forward(
    request: VerifyCheckpointRequest, job: JobContext, model: torch.nn.Module, result: LoadAndRun
) -> LoadAndRun:
    device = resolve_device(request.device)
    with user_code("moving the model to the device"):
        model = model.to(device).eval()
    batch = make_batch(request, job.cwd, job.allowed_roots, device)
    try:
        with torch.no_grad():
            output = call_model(model, to_device(batch, device))
    except Exception as e:
        result.error = _error_text("the forward pass", e)
        return result
    result.forward_ran = True
    result.batch_rule = describe_rule(model, batch, None)
    tensors = [t for _, t in walk(output) if isinstance(t, torch.Tensor)]
    result.output_shapes = [list(t.shape) for t in tensors[:20]]
    floats = [t for t in tensors if t.is_floating_point() or t.is_complex()]
    result.output_finite = all(bool(torch.isfinite(t).all()) for t in floats) if floats else None
    return result


def run(request: VerifyCheckpointRequest, job: JobContext) -> VerifyCheckpointResult:
    path = resolve_checkpoint_path(request.path, job)
    job.progress(0, 4, "static scan (nothing is loaded yet)")
    policy = Policy(numpy=request.allow_numpy, data_classes=request.allow_data_classes)
    scan = scan_path(path, policy, allowed_roots=job.allowed_roots)
    facts = static_facts(scan, request.max_listed)
    loaded: LoadedCheckpoint | None = None
    load_error = None
    if facts["safe"]:
        job.progress(1, 4, "loading the safe checkpoint")
        try:
            loaded = load_checkpoint(scan)
        except Exception as e:  # noqa: BLE001 - any refusal by the loader: the file is not called safe
            load_error = (
                str(e) if isinstance(e, CheckpointLoadError) else f"{type(e).__name__}: {str(e)[:800]}"
            )
            not_safe(facts, "unsafe", "loader_refused", path.name, f"{LOADER_REFUSED}: {load_error}")
        if loaded is not None and loaded.problems:
            facts["safe"] = False
            facts["verdict"] = "unsafe"
            facts["allowlist_recipe"] = None
            facts["problems"] += [
                FileProblem(
                    code=p.code, source=p.source, message=p.message, severity=p.severity, blocks_safe=True
                )
                for p in loaded.problems
            ]
            loaded = None
    obj = loaded.obj if loaded is not None else None
    resume = find_resume_roles(obj, folder=loaded.folder) if loaded is not None else None
    tensors = summarize_tensors(obj, max_listed=10) if loaded is not None else None
    nonfinite = []
    scanned = False
    if loaded is not None and request.scan_nonfinite:
        job.progress(2, 4, "counting NaN/Inf")
        try:
            nonfinite = find_nonfinite(obj, loaded.mapped_file, request.max_listed)
            scanned = True
        except (CheckpointLoadError, OSError, RuntimeError, ValueError) as e:
            # tensor bytes the headers promised but the file does not hold (a DCP item or range cut short)
            load_error = (
                f"corrupt/unreadable tensor data while counting NaN/Inf: {type(e).__name__}: {str(e)[:400]}"
            )
            not_safe(facts, "corrupt", "tensor_data_unreadable", path.name, load_error)
    key_mismatch = None
    adapter = None
    run_result = None
    model_params = None
    config_path = adapter_config_path(
        path, Confinement.of(path if path.is_dir() else path.parent, job.allowed_roots)
    )
    if request.model is not None and loaded is not None and resume is not None:
        job.progress(3, 4, f"building {request.model}")
        model = build_model(request, job.cwd, job.allowed_roots, None, to_device=False)
        model_params = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
        state = _checkpoint_model_state(loaded, resume)
        if state is not None and config_path is not None:
            adapter = _adapter_check(config_path, config_path.parent, state[1], model, request.max_listed)
            if request.load_and_run:
                run_result = _load_and_run(request, job, model, state[1], None, config_path.parent)
        elif state is not None:
            compared, entries = state
            shapes = {}
            for k, v in entries.items():
                info = leaf_info(v)
                if info is not None:
                    shapes[k] = (info.shape, info.dtype)
            keys = model_keys(model)
            key_mismatch, report = _compare(path, loaded, compared, shapes, keys, model, request.max_listed)
            if request.load_and_run:
                run_result = _load_and_run(request, job, model, entries, report)
    elif request.load_and_run:
        why = "is not safe to load" if not facts["safe"] else "could not be loaded (see load_error)"
        run_result = LoadAndRun(
            loaded=False,
            prefix_fix_applied=False,
            error=f"not attempted: the checkpoint {why}",
            forward_ran=False,
            output_shapes=[],
            output_finite=None,
        )
    result = VerifyCheckpointResult(
        path=str(path),
        layout=_layout(scan, loaded, resume, config_path is not None),
        loaded=loaded is not None,
        loaded_with=loaded.how if loaded is not None else None,
        load_error=load_error,
        tensors=tensors,
        nonfinite_scanned=scanned,
        nonfinite_tensors=nonfinite,
        resume=resume,
        missing_for_resume=resume.missing if resume is not None else [],
        optimizers=optimizer_checks(obj, resume, model_params, request.max_listed)
        if resume is not None
        else [],
        key_mismatch=key_mismatch,
        adapter=adapter,
        load_and_run=run_result,
        findings=[],
        summary="",
        **facts,
    )
    extra = []
    if request.model is not None and loaded is not None and key_mismatch is None and adapter is None:
        extra.append(
            Finding(
                severity="warning",
                code="no_model_state_to_compare",
                message="a model was given but the checkpoint holds no recognisable model state dict to compare "
                "it with.",
                skill=SKILL,
            )
        )
    own = own_classes(scan, import_roots(path, [*job.allowed_roots, job.cwd])) if not result.safe else None
    result.findings = build_findings(result, own) + extra
    result.summary = build_summary(result, own)
    job.progress(4, 4, "done")
    return VerifyCheckpointResult.model_validate(wire_safe_result(result.model_dump()))
