"""Request and result schemas of check_gradients (no torch here: the server imports this module).

Use `GradientRequest(model="net.py:build", input_shape=[8, 16])` for a model check, or
`GradientRequest(function="ops.py:MySquare", input_shape=[3, 4])` for gradcheck mode; the worker
(`torch_skills.gradients.worker:run`) returns a `GradientResult`. `FINDING_CODES` lists every finding
code the tool emits and what it means.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from torch_skills.results import BatchRule, Finding, RunInfo
from torch_skills.userspec import ModelInputs

FINDING_CODES: dict[str, str] = {
    "nonfinite_input": "the input batch already holds NaN/Inf before the model runs",
    "nonfinite_parameters": "parameters hold NaN/Inf before the forward pass (a bad checkpoint or init)",
    "nonfinite_forward": "the forward pass creates NaN/Inf from finite values (nonfinite.module/op say where)",
    "nonfinite_loss": "the model output is finite but the loss function turns it into NaN/Inf",
    "nonfinite_backward": "forward and loss are finite but backward creates NaN/Inf (nonfinite.autograd_node)",
    "fp16_overflow": "the first non-finite value is an Inf in float16: values above 65504 overflow",
    "loss_not_differentiable": "the loss does not require grad: no parameter can learn from it",
    "unused_parameters": "parameters whose module never ran in forward (a branch never taken), or ran but "
    "fed nothing into the loss; DDP reports these as 'did not receive grad'",
    "graph_break_detach": "a module ran but its output was cut from the loss (.detach(), .data, .item(), "
    "numpy round trip, or an output the loss never uses), so its parameters get no gradient",
    "graph_break_no_grad": "a module ran under torch.no_grad()/inference_mode, so its parameters get no gradient",
    "frozen_parameters": "some parameters have requires_grad=False (info; check it is intended)",
    "exploding_gradients": "a layer's gradient norm is above thresholds.exploding_grad_norm, or gradients "
    "grow by more than thresholds.depth_ratio from the last layer to the first",
    "vanishing_gradients": "gradients shrink by more than thresholds.depth_ratio from the last layer to the first",
    "dead_activations": "a ReLU-family module outputs zero for most units across the whole batch",
    "zero_gradients": "parameters that took part in the loss received a gradient of exactly zero",
    "custom_function_in_graph": "the graph contains custom autograd Functions; verify them with gradcheck mode",
    "gradcheck_failed": "the function's backward disagrees with finite differences (or failed to run)",
    "gradgradcheck_failed": "the second derivative (backward of backward) disagrees with finite differences",
    "by_design_zeros": "info: zero or missing gradients that are there by design (embedding rows no token used "
    "this batch, modules skipped at random by LayerDrop/stochastic depth); by_design_zeros says which",
    "loss_on_probabilities": "a loss that expects logits (or log-probabilities) is fed the output of a "
    "softmax/sigmoid, as the autograd graph shows (double softmax, sigmoid before BCEWithLogitsLoss)",
    "redundant_log_softmax": "info: log_softmax applied twice before the loss; harmless (log_softmax is "
    "idempotent) but one of them can go",
}


class GradientThresholds(BaseModel):
    """Limits that turn statistics into findings. Heuristics, stated so a reader can judge them."""

    exploding_grad_norm: float = Field(
        default=1e3,
        gt=0,
        description="a layer gradient L2 norm above this is 'exploding' (with a mean-reduced loss, healthy "
        "layers sit around 1e-4..1e1)",
    )
    depth_ratio: float = Field(
        default=1e3,
        gt=1,
        description="first-layer/last-layer gradient norm above this is exploding, below 1/this vanishing "
        "(three orders of magnitude across depth stalls the early layers)",
    )
    small_grad_norm: float = Field(
        default=1e-8,
        gt=0,
        description="a parameter gradient norm below this (but not zero) is flagged small_grad",
    )
    dead_unit_fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="a ReLU-family module with at least this fraction of output units zero for every sample "
        "is reported as dead",
    )


class GradientRequest(ModelInputs):
    """A model check (`model` + inputs) or, with `function`, a gradcheck of a custom function."""

    model: str | None = Field(  # type: ignore[assignment]  # optional here: gradcheck mode needs none
        default=None,
        description="model factory 'file.py:build' or 'package.module:build'; or give function",
    )
    function: str | None = Field(
        default=None,
        description="gradcheck mode: 'file.py:MyFunction', an autograd.Function (called via .apply) "
        "or a callable; inputs/input_shape are its arguments, cast to float64",
    )
    gradgradcheck: bool = Field(default=False, description="gradcheck mode: also check second derivatives")
    fast_mode: bool = Field(
        default=False,
        description="gradcheck mode: torch's fast gradcheck (random projections, for larger inputs)",
    )
    train_mode: bool = Field(default=True, description="call model.train() (True) or model.eval() (False)")
    seed: int = Field(
        default=0, description="torch.manual_seed before the build and every pass: same weights, same dropout"
    )
    thresholds: GradientThresholds = Field(default_factory=GradientThresholds)

    @model_validator(mode="after")
    def _model_or_function(self) -> GradientRequest:
        if (self.model is None) == (self.function is None):
            raise ValueError(
                "give exactly one of model ('file.py:build', checks a whole model) or function "
                "('file.py:MyFunction', runs gradcheck on it)"
            )
        return self


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------
Phase = Literal["input", "parameters", "forward", "loss", "backward"]
ParamFlag = Literal[
    "frozen",
    "no_grad",
    "nonfinite_grad",
    "nonfinite_value",
    "zero_grad",
    "zero_init_gated",
    "stochastic_zero_grad",
    "large_grad",
    "small_grad",
]


class NonfiniteLocation(BaseModel):
    """Where the first NaN/Inf is created: the module and op that made it, not those that passed it on."""

    phase: Phase = Field(description="input batch, parameters, forward, loss function, or backward")
    module: str | None = Field(
        description="qualified name as in model.named_modules() ('' is the top-level model's own forward); "
        "None when it happened outside the model (loss function, input batch)"
    )
    module_type: str | None = Field(default=None, description="class name of that module, e.g. 'Linear'")
    op: str | None = Field(
        default=None,
        description="forward/loss: the torch function that produced it ('log', 'div', 'linear'); "
        "backward: the autograd node ('SqrtBackward0')",
    )
    autograd_node: str | None = Field(
        default=None, description="backward phase: autograd node whose output gradient is non-finite"
    )
    inputs_finite: bool | None = Field(
        default=None,
        description="forward: were that op's (or module's) tensor inputs finite; backward: was the gradient "
        "flowing into that node finite. True means this is where the NaN/Inf was created.",
    )
    kind: Literal["nan", "inf", "nan_and_inf"] = Field(description="what the first non-finite tensor held")
    dtype: str | None = Field(default=None, description="dtype of that tensor, e.g. 'float16'")
    source: str | None = Field(
        default=None, description="'file.py:line' in the user's code that ran the op, when it could be found"
    )
    cause: str | None = Field(
        default=None,
        description="what the op's operands held, measured when it made the NaN/Inf: e.g. 'the divisor "
        "(argument 2, shape [8, 1]) is 0 at 2 of 8 entries' or the infeasible CTC samples' lengths",
    )
    fix: str | None = Field(default=None, description="the fix for that op and cause, when one is known")
    located_by: Literal[
        "module_hooks", "op_trace", "autograd_hooks", "parameter_scan", "input_scan", "not_reproduced"
    ] = Field(
        description="op_trace/autograd_hooks: the exact op or node; module_hooks: module granularity only; "
        "not_reproduced: the traced rerun came out finite, so only the phase is known"
    )


class ParameterGradient(BaseModel):
    name: str = Field(description="as in model.named_parameters()")
    shape: list[int]
    requires_grad: bool
    grad_norm: float | None = Field(
        description="L2 norm of .grad; None when there is no grad or it is not finite"
    )
    param_norm: float | None = Field(description="L2 norm of the parameter; None when it is not finite")
    ratio: float | None = Field(
        description="grad_norm / param_norm (None when either is missing or param_norm is 0)"
    )
    flags: list[ParamFlag] = Field(
        default_factory=list,
        description="frozen: requires_grad=False; no_grad: requires grad but .grad is None; nonfinite_grad / "
        "nonfinite_value: NaN/Inf in .grad / the weights; zero_grad: .grad is all zeros; zero_init_gated: "
        ".grad is all zeros only because a zero-initialized gain gates it (it gets gradient after one step); "
        "stochastic_zero_grad: .grad is all zeros with this seed but not with another (stochastic depth); large_grad / "
        "small_grad: grad_norm beyond thresholds.exploding_grad_norm / below thresholds.small_grad_norm",
    )


class LayerGradient(BaseModel):
    """A module that owns trainable parameters, in the order the forward pass first ran it."""

    depth: int = Field(description="0 = the first parameterized module the forward pass ran")
    module: str
    module_type: str
    grad_norm: float | None = Field(description="L2 norm over the gradients of the module's own parameters")
    param_norm: float | None
    ratio: float | None = Field(description="grad_norm / param_norm")


class DepthProfile(BaseModel):
    layers: list[LayerGradient]
    first_to_last_ratio: float | None = Field(
        description="grad_norm of the first layer / grad_norm of the last (both with a finite, non-zero gradient)"
    )
    trend: Literal["exploding", "vanishing", "stable", "unknown"] = Field(
        description="from first_to_last_ratio against thresholds.depth_ratio; unknown with under 3 layers"
    )
    excluded: list[str] = Field(
        default_factory=list,
        description="embedding modules left out of the trend: their gradient is non-zero only on the rows the "
        "batch looked up, so its norm is not comparable with a dense layer's",
    )
    trend_with_excluded: Literal["exploding", "vanishing", "stable", "unknown"] | None = Field(
        default=None,
        description="the trend if the excluded embeddings counted (None when none were excluded)",
    )


class ActivationStats(BaseModel):
    """Zeros in the output of a ReLU-family module (ReLU, ReLU6, LeakyReLU, PReLU, RReLU, Threshold)."""

    module: str
    module_type: str
    calls: int
    zero_fraction: float = Field(description="fraction of all output elements that are exactly zero")
    dead_unit_fraction: float | None = Field(
        description="fraction of output positions (every dim but the batch dim 0) that are zero for every "
        "sample of the batch; None when the batch has one sample"
    )


class GraphBreak(BaseModel):
    """Trainable parameters of one module that received no gradient, and why."""

    module: str
    module_type: str
    cause: Literal["never_ran", "stochastic_skip", "detached", "no_grad", "output_unused"] = Field(
        description="never_ran: the forward never called it; stochastic_skip: it did not run with this seed "
        "but did with another (LayerDrop/stochastic depth: skipped at random in training); detached: it ran but a .detach()/.data/.item()/"
        ".numpy() call cut its result from the loss; no_grad: it ran with autograd off; output_unused: it ran "
        "but nothing it computed reaches the loss (a discarded output, or a parameter never read)"
    )
    parameters: list[str]
    source: str | None = Field(
        default=None,
        description="detached: 'file.py:line' of the first .detach()/.data/.item()/.numpy() call seen in the "
        "forward pass, when one was seen",
    )


class ByDesignZeros(BaseModel):
    """Parameters with zero or no gradient on purpose, recognised and not reported as a problem."""

    module: str
    module_type: str
    kind: Literal["unused_embedding_rows", "stochastic_skip"] = Field(
        description="unused_embedding_rows: an embedding's rows that no token of this batch looked up (the "
        "padding_idx row always) get zero gradient; stochastic_skip: the module was skipped at random in "
        "training with this seed and ran with another"
    )
    parameters: list[str]
    detail: str = Field(description="what was measured, e.g. '3987 of 4000 rows got no token'")


class LossInput(BaseModel):
    """A loss node fed by a softmax/sigmoid, read from the autograd graph (grad_fn names)."""

    loss_node: str = Field(description="the loss's autograd node, e.g. 'NllLossBackward0'")
    chain: list[str] = Field(
        description="the nodes feeding it, loss side first, shape-only nodes (view, permute) skipped"
    )
    problem: Literal[
        "double_softmax", "probabilities_into_nll", "probabilities_into_bce_with_logits", "log_softmax_twice"
    ]


class LossInfo(BaseModel):
    value: float | None = Field(description="the loss; None when it is NaN/Inf (see text)")
    text: str = Field(description="the loss as printed, e.g. '0.6931' or 'nan'")
    finite: bool
    requires_grad: bool
    how: str = Field(description="how it was computed (the default reduction or the user's loss function)")


class JacobianEntry(BaseModel):
    """One entry of a Jacobian: d output[tensor][index] / d input[tensor][index]."""

    output_tensor: int = Field(description="position of the output tensor (0 for a single output)")
    output_index: list[int]
    input_tensor: int = Field(description="position of the input argument")
    input_index: list[int]
    numerical: float | None = Field(description="central finite difference (None when not finite)")
    analytical: float | None = Field(description="what backward returned (None when not finite)")


class GradcheckReport(BaseModel):
    function: str
    function_kind: Literal["autograd.Function", "callable"]
    input_shapes: list[list[int]] = Field(description="shapes of the float64 inputs that were checked")
    passed: bool = Field(description="torch.autograd.gradcheck's verdict")
    message: str = Field(description="gradcheck's message ('' when it passed), shortened")
    max_abs_error: float | None = Field(
        description="max |numerical - analytical| over the whole Jacobian (computed by this tool); None when "
        "it is not finite or backward failed"
    )
    worst: JacobianEntry | None = Field(description="the Jacobian entry with that error")
    worst_output: list[int] | None = Field(description="[output tensor, *index] of the worst entry")
    worst_input: list[int] | None = Field(description="[input tensor, *index] of the worst entry")
    fast_mode: bool
    eps: float
    atol: float
    rtol: float
    gradgradcheck_passed: bool | None = Field(default=None, description="None when not asked for")
    gradgradcheck_message: str | None = None


class StepTimings(BaseModel):
    """Seconds spent in each step inside the worker."""

    build_s: float = Field(default=0.0, description="importing the user's file and calling the factory")
    inputs_s: float = Field(default=0.0, description="building the batch")
    forward_s: float = Field(default=0.0, description="the hooked forward pass plus the loss")
    backward_s: float = Field(default=0.0, description="loss.backward()")
    localize_s: float = Field(
        default=0.0, description="the second, traced pass; 0 when nothing needed locating"
    )
    gradcheck_s: float = Field(
        default=0.0, description="gradcheck mode: gradcheck plus the Jacobian comparison"
    )


class GradientResult(BaseModel):
    """What check_gradients found. `findings[*].code` values are listed in FINDING_CODES."""

    mode: Literal["model", "gradcheck"]
    target: str = Field(description="the model factory or function that was checked")
    loss: LossInfo | None = None
    batch_rule: BatchRule | None = Field(
        default=None, description="how the batch was fed and where the loss came from (model mode)"
    )
    nonfinite: NonfiniteLocation | None = Field(
        default=None, description="None when every value and gradient was finite"
    )
    parameters: list[ParameterGradient] = Field(default_factory=list)
    total_grad_norm: float | None = Field(
        default=None, description="L2 norm over all finite parameter gradients (what clip_grad_norm_ sees)"
    )
    unused_parameters: list[str] = Field(
        default_factory=list,
        description="requires_grad=True but .grad is None after backward (DDP's 'did not receive grad' list)",
    )
    frozen_parameters: list[str] = Field(default_factory=list, description="requires_grad=False")
    zero_init_gated: list[str] = Field(
        default_factory=list,
        description="parameters with an all-zero gradient at initialization by design: a gain initialized to "
        "exactly zero (zero-init residual, layer scale) gates them, and one step on it gives them gradient",
    )
    graph_breaks: list[GraphBreak] = Field(
        default_factory=list, description="why unused_parameters got no grad"
    )
    by_design_zeros: list[ByDesignZeros] = Field(
        default_factory=list, description="zero or missing gradients that are there by design"
    )
    loss_inputs: list[LossInput] = Field(
        default_factory=list, description="losses fed probabilities where they expect logits"
    )
    depth_profile: DepthProfile | None = None
    activations: list[ActivationStats] = Field(default_factory=list)
    custom_functions: list[str] = Field(
        default_factory=list,
        description="custom autograd Functions in the graph, as 'file.py:MyFunction' (ready for gradcheck mode) "
        "when their file is known, else the backward node's name",
    )
    gradcheck: GradcheckReport | None = None
    thresholds: GradientThresholds = Field(default_factory=GradientThresholds)
    timings: StepTimings = Field(default_factory=StepTimings)
    findings: list[Finding] = Field(
        default_factory=list,
        description="what to fix, most severe first; codes: " + ", ".join(sorted(FINDING_CODES)),
    )
    summary: str = Field(description="two or three sentences a person can act on")
    run: RunInfo | None = None
