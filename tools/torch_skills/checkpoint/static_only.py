"""verify_checkpoint without torch: the static scan's answer, and what was skipped and how to get it.

The server's own environment has no torch when it was installed alone (`pip install torch-skills`,
`uvx torch-skills`, the Claude Code plugin). A call that names only files (no `model`) then runs
here, in a worker that never imports torch (`torch_skills.runner.zygote --without-torch`): the
scan reads every container the way its loader would and decides the verdict, exactly as with
torch; nothing is loaded, so the tensor summary, the NaN/Inf count, the resume checks and the fit
are skipped, and the result says so with the command that enables them.

Known limitations: with no loader to cross-check it, a file the static scan calls safe is not also
opened by its format's own loader (which, with torch, turns a refusal into "unsafe").
"""

from __future__ import annotations

from torch_skills.checkpoint.allowlist import Policy
from torch_skills.checkpoint.filetext import wire_safe_result
from torch_skills.checkpoint.models import VerifyCheckpointRequest, VerifyCheckpointResult
from torch_skills.checkpoint.report import SKILL, build_findings, build_summary
from torch_skills.checkpoint.scan import scan_path
from torch_skills.checkpoint.static import import_roots, own_classes, resolve_checkpoint_path, static_facts
from torch_skills.results import Finding
from torch_skills.runner.child import JobContext

SKIPPED_WITHOUT_TORCH = (
    "No torch in the server's environment, so nothing was loaded: the verdict comes from the static scan alone; "
    "the tensor summary, the NaN/Inf count, the resume checks and the fit against a model were skipped. To run "
    "them, pass model='path/to/file.py:build' (runs under your project's interpreter, which has torch), "
    "restart the server with --python /path/to/your/project/.venv/bin/python, or install "
    "'torch-skills[torch]'."
)


def run(request: VerifyCheckpointRequest, job: JobContext) -> VerifyCheckpointResult:
    """The static part of `torch_skills.checkpoint.worker.run`, with the skipped checks named."""
    path = resolve_checkpoint_path(request.path, job)
    job.progress(0, 2, "static scan (nothing is loaded; no torch here)")
    policy = Policy(numpy=request.allow_numpy, data_classes=request.allow_data_classes)
    scan = scan_path(path, policy, allowed_roots=job.allowed_roots)
    facts = static_facts(scan, request.max_listed)
    result = VerifyCheckpointResult(
        path=str(path),
        layout="not_loaded",
        loaded=False,
        loaded_with=None,
        load_error=None,
        tensors=None,
        nonfinite_scanned=False,
        nonfinite_tensors=[],
        resume=None,
        missing_for_resume=[],
        optimizers=[],
        key_mismatch=None,
        load_and_run=None,
        findings=[],
        summary="",
        **facts,
    )
    own = own_classes(scan, import_roots(path, [*job.allowed_roots, job.cwd])) if not result.safe else None
    skipped = Finding(
        severity="info", code="checks_skipped_without_torch", message=SKIPPED_WITHOUT_TORCH, skill=SKILL
    )
    result.findings = [*build_findings(result, own), skipped]
    result.summary = f"{build_summary(result, own)} Static scan only: no torch in the server's environment."
    job.progress(2, 2, "done")
    return VerifyCheckpointResult.model_validate(wire_safe_result(result.model_dump()))
