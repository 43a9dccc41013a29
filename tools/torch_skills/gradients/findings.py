"""Turn the facts in a GradientResult into findings (what to do, which skill to read) and a summary.

Use `diagnose(result)` after every fact is filled in: it sets `result.findings` (most severe first)
and `result.summary`. Codes are those of `torch_skills.gradients.models.FINDING_CODES`.
"""

from __future__ import annotations

from torch_skills.gradients.models import FINDING_CODES, GradientResult, GraphBreak, NonfiniteLocation
from torch_skills.results import Finding

_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
FP16_MAX = 65504.0  # largest finite float16 value (IEEE 754 half precision)
_KIND_TEXT = {"nan": "NaN", "inf": "Inf", "nan_and_inf": "NaN and Inf"}


def _module(name: str | None, type_name: str | None) -> str:
    if name is None:
        return "code outside the model"
    if name == "":
        return (
            f"the top-level model's own forward ({type_name})"
            if type_name
            else "the top-level model's forward"
        )
    return f"module `{name}` ({type_name})" if type_name else f"module `{name}`"


def _listing(items: list[str], limit: int = 4) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _num(x: float | None) -> str:
    return "a non-finite value" if x is None else f"{x:.6g}"


def _at(source: str | None) -> str:
    return f" at {source}" if source else ""


def _finding(severity: str, code: str, message: str, skill: str | None) -> Finding:
    assert code in FINDING_CODES, code
    return Finding(severity=severity, code=code, message=message, skill=skill)  # type: ignore[arg-type]


def nonfinite_findings(where: NonfiniteLocation, loss_how: str | None) -> list[Finding]:
    kind = _KIND_TEXT[where.kind]
    out: list[Finding] = []
    if where.located_by == "not_reproduced":
        code = {"forward": "nonfinite_forward", "loss": "nonfinite_loss"}.get(
            where.phase, "nonfinite_backward"
        )
        out.append(
            _finding(
                "error",
                code,
                f"The {where.phase} pass produces {kind}, but a traced rerun with the same seed came out finite, "
                "so no op can be named (nondeterministic code or kernels). Call again, or check the values "
                "module by module with forward hooks.",
                "debugging-techniques",
            )
        )
        return out
    if where.phase == "input":
        out.append(
            _finding(
                "error",
                "nonfinite_input",
                f"The input batch already holds {kind} before the model runs; fix the data pipeline or the inputs "
                "function (drop or repair samples where torch.isfinite(x).all() is False).",
                "debugging-techniques",
            )
        )
    elif where.phase == "parameters":
        out.append(
            _finding(
                "error",
                "nonfinite_parameters",
                f"Parameter or buffer `{where.op}` of {_module(where.module, where.module_type)} holds {kind} "
                "before the forward pass: the weights come from a diverged run, a bad checkpoint or a broken init; "
                "reload or re-initialize them.",
                "debugging-techniques",
            )
        )
    elif where.phase == "forward":
        op = f"`{where.op}`" if where.op else "its forward"
        if where.inputs_finite and where.cause:
            text = (
                f"{op} in {_module(where.module, where.module_type)}{_at(where.source)} turns finite inputs into "
                f"{kind}: {where.cause}. {where.fix or ''}"
            ).rstrip()
        elif where.inputs_finite:
            text = (
                f"{op} in {_module(where.module, where.module_type)}{_at(where.source)} turns finite inputs into "
                f"{kind}. Guard that op: clamp or mask its input, add an eps, or use a stable form "
                "(log1p, logsumexp, F.normalize, log_softmax)."
            )
        else:
            text = (
                f"The first {kind} seen in forward is in {op} in {_module(where.module, where.module_type)}"
                f"{_at(where.source)}, but its inputs were already non-finite (made by code the trace cannot see)."
            )
        out.append(_finding("error", "nonfinite_forward", text, "debugging-techniques"))
    elif where.phase == "loss":
        if where.cause:
            advice = f": {where.cause}. {where.fix or ''}".rstrip()
        else:
            advice = (
                ". Use the numerically stable form: losses on logits (F.binary_cross_entropy_with_logits, "
                "F.cross_entropy) or log_softmax instead of log(softmax)."
            )
        out.append(
            _finding(
                "error",
                "nonfinite_loss",
                f"The model output is finite but the loss ({loss_how}) produces {kind} in `{where.op}`"
                f"{_at(where.source)}{advice}",
                "debugging-techniques",
            )
        )
    elif where.phase == "backward":
        made_in = _module(where.module, where.module_type)
        head = (
            f"Forward and loss are finite, but backward node {where.autograd_node} (from {made_in}"
            f"{_at(where.source)}) turns a finite gradient into {kind}"
        )
        if where.cause:
            text = f"{head}: {where.cause}. {where.fix or ''}".rstrip()
        else:
            text = (
                f"{head}. Typical causes: sqrt, norm or pow at 0, log or division near 0 hidden behind torch.where "
                "or a mask; add the eps inside the op or mask its input, not its output."
            )
        out.append(_finding("error", "nonfinite_backward", text, "debugging-techniques"))
    if where.dtype == "float16" and "inf" in where.kind:
        out.append(
            _finding(
                "warning",
                "fp16_overflow",
                f"The first non-finite value is an Inf in float16, whose largest value is {FP16_MAX:g}: run that "
                "part in float32 or bfloat16 (torch.autocast keeps reductions and losses in float32) and scale "
                "the loss with torch.amp.GradScaler.",
                "mixed-precision-and-optimization",
            )
        )
    return out


def _break_findings(breaks: list[GraphBreak]) -> list[Finding]:
    by_cause: dict[str, list[GraphBreak]] = {}
    for b in breaks:
        by_cause.setdefault(b.cause, []).append(b)
    out = []

    def names(group: list[GraphBreak]) -> tuple[str, int]:
        modules = [f"`{b.module}`" if b.module else "the top-level model" for b in group]
        return _listing(modules), sum(len(b.parameters) for b in group)

    if "never_ran" in by_cause:
        mods, n = names(by_cause["never_ran"])
        out.append(
            _finding(
                "warning",
                "unused_parameters",
                f"{mods} never ran in the forward pass (a branch not taken), so its {n} parameters get no "
                "gradient; DDP then fails with 'did not receive grad' unless find_unused_parameters=True. "
                "Remove the module, or make sure the branch feeds the loss.",
                "module-design-patterns",
            )
        )
    if "output_unused" in by_cause:
        mods, n = names(by_cause["output_unused"])
        out.append(
            _finding(
                "warning",
                "unused_parameters",
                f"{mods} ran, but nothing it computed reaches the loss (an output that is discarded, or a parameter "
                f"never read in forward), so {n} parameters get no gradient. Use the output in the loss or drop it.",
                "module-design-patterns",
            )
        )
    by_source: dict[str | None, list[GraphBreak]] = {}
    for b in by_cause.get("detached", []):
        by_source.setdefault(b.source, []).append(b)
    for source, group in by_source.items():
        mods, n = names(group)
        params = [p for b in group for p in b.parameters]
        out.append(
            _finding(
                "warning",
                "graph_break_detach",
                f"{mods} ran, but the result was cut from the loss{_at(source)} (.detach(), .data, .item() or a "
                f"numpy round trip), so {n} parameters ({_listing(params, 3)}) get no gradient. Remove the cut "
                "unless those layers are meant to stay fixed (then freeze them with requires_grad_(False)).",
                "debugging-techniques",
            )
        )
    if "no_grad" in by_cause:
        mods, n = names(by_cause["no_grad"])
        out.append(
            _finding(
                "warning",
                "graph_break_no_grad",
                f"{mods} ran with autograd off (inside torch.no_grad() or torch.inference_mode()), so {n} parameters "
                "get no gradient. Move the call out of the no_grad block, or freeze those parameters explicitly.",
                "debugging-techniques",
            )
        )
    return out


def _gradient_findings(result: GradientResult) -> list[Finding]:
    out = []
    limits = result.thresholds
    profile = result.depth_profile
    large = [p for p in result.parameters if "large_grad" in p.flags]
    if profile is not None and (profile.trend == "exploding" or large):
        worst = max(
            (layer for layer in profile.layers if layer.grad_norm is not None),
            key=lambda layer: layer.grad_norm or 0.0,
            default=None,
        )
        parts = []
        if worst is not None and worst.grad_norm and worst.grad_norm > limits.exploding_grad_norm:
            parts.append(
                f"layer `{worst.module}` has a gradient norm of {worst.grad_norm:.3g} "
                f"(above {limits.exploding_grad_norm:g})"
            )
        if profile.trend == "exploding" and profile.first_to_last_ratio:
            parts.append(
                f"gradients grow {profile.first_to_last_ratio:.3g}x from the last layer to the first"
            )
        if not parts:
            parts.append(f"{len(large)} parameters have gradient norms above {limits.exploding_grad_norm:g}")
        out.append(
            _finding(
                "warning",
                "exploding_gradients",
                "Exploding gradients: " + "; ".join(parts) + ". Check the init scale (Kaiming/Xavier for the "
                "activation), add normalization or residual scaling, lower the learning rate and clip with "
                "torch.nn.utils.clip_grad_norm_.",
                "debugging-techniques",
            )
        )
    if profile is not None and profile.trend == "vanishing" and profile.first_to_last_ratio:
        usable = [
            layer for layer in profile.layers if layer.grad_norm and layer.module not in profile.excluded
        ]
        out.append(
            _finding(
                "warning",
                "vanishing_gradients",
                f"Vanishing gradients: they shrink {1 / profile.first_to_last_ratio:.3g}x from the last layer "
                f"(`{usable[-1].module}`) to the first (`{usable[0].module}`), so early layers barely learn. Typical "
                "of saturating activations (sigmoid/tanh) in deep stacks or a too-small init; use ReLU/GELU, "
                "residual connections, normalization or a scaled init.",
                "debugging-techniques",
            )
        )
    for act in result.activations:
        dead = act.dead_unit_fraction
        if dead is not None and dead >= limits.dead_unit_fraction:
            out.append(
                _finding(
                    "error" if dead >= 1.0 else "warning",
                    "dead_activations",
                    f"`{act.module}` ({act.module_type}) outputs zero for {dead:.0%} of its units on every sample "
                    f"({act.zero_fraction:.0%} of all outputs are zero); dead units pass no gradient. Typical causes: "
                    "a large negative bias, a too-high learning rate, unnormalized inputs; try LeakyReLU/GELU, a "
                    "smaller learning rate, or re-initialize.",
                    "debugging-techniques",
                )
            )
    if profile is not None and profile.excluded and profile.trend_with_excluded not in (None, profile.trend):
        rows = {z.module: z.detail for z in result.by_design_zeros if z.kind == "unused_embedding_rows"}
        shown = [f"`{m}`: {rows[m]}" if m in rows else f"`{m}`" for m in profile.excluded]
        out.append(
            _finding(
                "info",
                "by_design_zeros",
                "An embedding's gradient is zero by design on every row no token looked up ("
                + "; ".join(shown[:3])
                + f"), so its norm is not comparable with a dense layer's. Counting the embeddings the depth trend "
                f"would read '{profile.trend_with_excluded}'; it leaves them out and reads '{profile.trend}'. "
                "Nothing to fix.",
                "debugging-techniques",
            )
        )
    zero = [p.name for p in result.parameters if "zero_grad" in p.flags]
    if zero:
        out.append(
            _finding(
                "warning",
                "zero_gradients",
                f"{len(zero)} parameters took part in the loss but got a gradient of exactly zero "
                f"({_listing(zero, 3)}): no signal reaches them (dead activations, a zero multiplier or a "
                "masked-out path).",
                "debugging-techniques",
            )
        )
    return out


_LOSS_NAMES = {
    "NllLossBackward": "nll_loss / cross_entropy",
    "NllLoss2DBackward": "nll_loss / cross_entropy",
    "BinaryCrossEntropyWithLogitsBackward": "binary_cross_entropy_with_logits",
}


def _loss_input_findings(result: GradientResult) -> list[Finding]:
    out = []
    seen: set[str] = set()
    norm = f"{result.total_grad_norm:.3g}" if result.total_grad_norm is not None else "n/a"
    for item in result.loss_inputs:
        if item.problem in seen:
            continue
        seen.add(item.problem)
        loss = _LOSS_NAMES.get(item.loss_node.rstrip("0123456789"), item.loss_node)
        graph = " <- ".join([item.loss_node, *item.chain])
        if item.problem == "log_softmax_twice":
            out.append(
                _finding(
                    "info",
                    "redundant_log_softmax",
                    f"The loss ({loss}) takes the log_softmax of values that are already log-probabilities (graph: "
                    f"{graph}). log_softmax is idempotent, so loss and gradient are unchanged; drop one of them "
                    "(pass logits to F.cross_entropy, or log-probabilities to F.nll_loss).",
                    "debugging-techniques",
                )
            )
            continue
        what = {
            "double_softmax": (
                "takes the log_softmax of probabilities (a softmax/sigmoid output): a double softmax. Inputs in "
                "[0, 1] make the second softmax nearly flat, so the loss cannot fall below "
                "log(1 + (num_classes - 1)/e) and the gradient is damped, by orders of magnitude once the first "
                "softmax saturates"
            ),
            "probabilities_into_nll": (
                "is fed probabilities (a softmax/sigmoid output) where nll_loss expects log-probabilities, so "
                "it minimizes -p instead of -log p"
            ),
            "probabilities_into_bce_with_logits": (
                "is fed a sigmoid/softmax output and applies its own sigmoid on top, so its input lies in [0, 1], "
                "every prediction is squashed to between 0.5 and 0.73 and gradients shrink"
            ),
        }[item.problem]
        fix = (
            "pass the logits (the tensor before the sigmoid) to BCEWithLogitsLoss"
            if item.problem == "probabilities_into_bce_with_logits"
            else "pass the logits (the tensor before the softmax) to F.cross_entropy / nn.CrossEntropyLoss, or "
            "F.log_softmax(logits) to F.nll_loss"
        )
        out.append(
            _finding(
                "warning",
                "loss_on_probabilities",
                f"The loss ({loss}) {what} (graph: {graph}; total gradient norm {norm}). Fix: {fix}, and apply "
                "softmax/sigmoid only for predictions.",
                "debugging-techniques",
            )
        )
    return out


def model_findings(result: GradientResult) -> list[Finding]:
    out: list[Finding] = []
    loss = result.loss
    if result.nonfinite is not None:
        out += nonfinite_findings(result.nonfinite, loss.how if loss else None)
    trainable = [p for p in result.parameters if p.requires_grad]
    if loss is not None and not loss.requires_grad and result.nonfinite is None:
        if result.parameters and not trainable:
            why = f"all {len(result.parameters)} parameters have requires_grad=False"
        else:
            why = "no parameter with requires_grad=True reaches it (forward under torch.no_grad(), or a detached output)"
        out.append(
            _finding(
                "error",
                "loss_not_differentiable",
                f"The loss does not require grad: {why}, so loss.backward() fails and nothing trains.",
                "debugging-techniques",
            )
        )
    out += _break_findings(result.graph_breaks)
    skipped = [z for z in result.by_design_zeros if z.kind == "stochastic_skip"]
    if skipped:
        mods = _listing([f"`{z.module}` ({z.module_type})" for z in skipped])
        n = sum(len(z.parameters) for z in skipped)
        out.append(
            _finding(
                "info",
                "by_design_zeros",
                f"{mods} got no gradient this step but do with other seeds (`{skipped[0].module}` "
                f"{skipped[0].detail}): skipped at random in training (LayerDrop or stochastic depth), so {n} "
                "parameters get no gradient on some steps by design. Nothing to fix; under DistributedDataParallel this needs "
                "find_unused_parameters=True.",
                "module-design-patterns",
            )
        )
    frozen = result.frozen_parameters
    if frozen and trainable:
        out.append(
            _finding(
                "info",
                "frozen_parameters",
                f"{len(frozen)} of {len(result.parameters)} parameters are frozen (requires_grad=False): "
                f"{_listing(frozen, 3)}. If they should train, look for requires_grad_(False) and check that the "
                "optimizer receives them.",
                "module-design-patterns",
            )
        )
    out += _loss_input_findings(result)
    if result.nonfinite is None:
        out += _gradient_findings(result)
    if result.custom_functions:
        out.append(
            _finding(
                "info",
                "custom_function_in_graph",
                f"The graph uses custom autograd Functions ({_listing(result.custom_functions)}); verify each "
                "backward with check_gradients(function='file.py:TheFunction', input_shape=[3, 4]).",
                "custom-autograd-functions",
            )
        )
    return out


def gradcheck_findings(result: GradientResult) -> list[Finding]:
    report = result.gradcheck
    if report is None:
        return []
    out = []
    if not report.passed:
        detail = ""
        if (
            report.worst is not None
            and report.max_abs_error is not None
            and report.max_abs_error > report.atol
        ):
            w = report.worst
            detail = (
                f" The worst Jacobian entry is d output{w.output_tensor}{w.output_index} / d input{w.input_tensor}"
                f"{w.input_index}: finite differences give {_num(w.numerical)}, backward gives {_num(w.analytical)} "
                f"(abs error {report.max_abs_error:.3g})."
            )
        first_line = report.message.splitlines()[0].rstrip(",:; ") + "." if report.message else ""
        out.append(
            _finding(
                "error",
                "gradcheck_failed",
                f"{report.function}'s backward disagrees with finite differences.{detail} gradcheck said: "
                f"{first_line[:300]} Re-derive the backward for that input (a missing factor or a wrong transpose is "
                "typical) and check what ctx saved.",
                "custom-autograd-functions",
            )
        )
    if report.gradgradcheck_passed is False:
        first_line = (
            (report.gradgradcheck_message or "").splitlines()[0][:300] if report.gradgradcheck_message else ""
        )
        out.append(
            _finding(
                "warning",
                "gradgradcheck_failed",
                f"Second derivatives of {report.function} are wrong or unsupported ({first_line}). This matters for "
                "double backward (gradient penalties, MAML, Hessian-vector products); write backward with "
                "differentiable torch ops, or mark it @once_differentiable so misuse fails loudly.",
                "custom-autograd-functions",
            )
        )
    return out


def _healthy_summary(result: GradientResult) -> str:
    if result.mode == "gradcheck" and result.gradcheck is not None:
        g = result.gradcheck
        second = " gradgradcheck passed too." if g.gradgradcheck_passed else ""
        return (
            f"{g.function}'s backward matches finite differences (max abs error {g.max_abs_error or 0:.2g} over "
            f"inputs {g.input_shapes}).{second}"
        )
    trainable = sum(1 for p in result.parameters if p.requires_grad)
    loss = result.loss.text if result.loss else "?"
    norm = f"{result.total_grad_norm:.3g}" if result.total_grad_norm is not None else "n/a"
    skipped = sum(len(z.parameters) for z in result.by_design_zeros if z.kind == "stochastic_skip")
    if skipped:
        return (
            f"No gradient problems found: the loss ({loss}) is finite and {trainable - skipped} of {trainable} "
            f"trainable parameters got finite, non-zero gradients (total norm {norm}); the other {skipped} belong "
            "to modules skipped at random this step, by design."
        )
    return (
        f"No gradient problems found: the loss ({loss}) is finite and all {trainable} trainable parameters got "
        f"finite, non-zero gradients (total norm {norm})."
    )


def diagnose(result: GradientResult) -> GradientResult:
    """Fill result.findings (sorted, most severe first) and result.summary."""
    findings = gradcheck_findings(result) if result.mode == "gradcheck" else model_findings(result)
    findings.sort(key=lambda f: _SEVERITY_ORDER[f.severity])
    result.findings = findings
    problems = [f for f in findings if f.severity != "info"]
    if not problems:
        notes = [f.code for f in findings]
        result.summary = _healthy_summary(result) + (f" Notes: {', '.join(notes)}." if notes else "")
        return result
    top = problems[0]
    others = sorted({f.code for f in findings} - {top.code})
    also = f" (also found: {', '.join(others)})" if others else ""
    if top.skill:
        next_step = f" Read the {top.skill} skill for the fix{also}."
    else:
        next_step = f" Also found: {', '.join(others)}." if others else ""
    result.summary = _first_sentences(top.message, 2) + next_step
    return result


def _first_sentences(text: str, n: int) -> str:
    """The first n sentences (split at '. '; the messages here use no abbreviations)."""
    parts = text.split(". ")
    head = ". ".join(parts[:n])
    return head if head.endswith(".") else head + "."
