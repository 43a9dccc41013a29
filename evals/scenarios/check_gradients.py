"""Eval scenarios for check_gradients: the buggy model zoo, gradcheck mode, refusals and faults.

The models live in tests/fixtures/gradient_zoo.py and gradient_real_bugs.py (shared with the unit
tests, one file per bug family); paths are relative to the repository root, the server's working directory in evals.
"""

from __future__ import annotations

from evals.framework import Expect, Scenario

ZOO = "tests/fixtures/gradient_zoo.py"
REAL = "tests/fixtures/gradient_real_bugs.py"  # models written like real ones (issue 26)
FAULTS = "tests/fixtures/malicious/gradient_faults.py"
BATCH = {"input_shape": [8, 16]}


def _model(factory: str, **extra) -> dict:
    return {"model": f"{ZOO}:{factory}", **(extra or BATCH)}


SCENARIOS: list[Scenario] = [
    Scenario(
        id="healthy-mlp-has-no-findings",
        tool="check_gradients",
        arguments=_model("healthy_mlp"),
        expect=[
            Expect("findings", "eq", []),
            Expect("nonfinite", "is_null"),
            Expect("loss.finite", "eq", True),
            Expect("unused_parameters", "eq", []),
            Expect("depth_profile.trend", "eq", "stable"),
        ],
        description="a plain MLP: nothing to report, and the summary says so",
    ),
    Scenario(
        id="nan-from-log-of-zero",
        tool="check_gradients",
        arguments=_model("log_of_zero"),
        expect=[
            Expect("nonfinite.phase", "eq", "forward"),
            Expect("nonfinite.module", "eq", "log"),
            Expect("nonfinite.op", "eq", "log"),
            Expect("nonfinite.inputs_finite", "eq", True),
            Expect("findings[0].code", "eq", "nonfinite_forward"),
            Expect("findings[0].skill", "eq", "debugging-techniques"),
        ],
        description="the module whose log makes -inf is named, not the Linear that spreads it",
    ),
    Scenario(
        id="nan-from-division-by-zero-norm",
        tool="check_gradients",
        arguments=_model("zero_norm_division", inputs=f"{ZOO}:inputs_with_zero_rows"),
        expect=[
            Expect("nonfinite.module", "eq", "normalize"),
            Expect("nonfinite.op", "eq", "div"),
            Expect("nonfinite.kind", "eq", "nan"),
        ],
    ),
    Scenario(
        id="backward-only-nan-from-sqrt-at-zero",
        tool="check_gradients",
        arguments=_model("sqrt_of_zero_backward", inputs=f"{ZOO}:inputs_with_zero_rows"),
        expect=[
            Expect("loss.finite", "eq", True),
            Expect("nonfinite.phase", "eq", "backward"),
            Expect("nonfinite.autograd_node", "eq", "SqrtBackward0"),
            Expect("nonfinite.module", "eq", "normalize"),
            Expect("findings[0].code", "eq", "nonfinite_backward"),
        ],
        description="anomaly-mode territory: forward is finite, the sqrt's backward divides by zero",
    ),
    Scenario(
        id="torch-where-hides-a-backward-nan",
        tool="check_gradients",
        arguments=_model("where_hides_sqrt_of_negative"),
        expect=[
            Expect("nonfinite.phase", "eq", "backward"),
            Expect("nonfinite.autograd_node", "eq", "SqrtBackward0"),
            Expect("nonfinite.module", "eq", ""),
        ],
    ),
    Scenario(
        id="nan-already-in-the-weights",
        tool="check_gradients",
        arguments=_model("nan_in_weights"),
        expect=[
            Expect("nonfinite.phase", "eq", "parameters"),
            Expect("nonfinite.module", "eq", "2"),
            Expect("findings[*].code", "eq", ["nonfinite_parameters"]),
        ],
    ),
    Scenario(
        id="nan-in-the-input-batch",
        tool="check_gradients",
        arguments=_model("healthy_mlp", inputs=f"{ZOO}:inputs_with_nan"),
        expect=[
            Expect("nonfinite.phase", "eq", "input"),
            Expect("findings[0].code", "eq", "nonfinite_input"),
        ],
    ),
    Scenario(
        id="naive-bce-loss-overflows",
        tool="check_gradients",
        arguments=_model("large_logits", input_shape=[8, 16], loss=f"{ZOO}:naive_bce_loss"),
        expect=[
            Expect("nonfinite.phase", "eq", "loss"),
            Expect("nonfinite.op", "eq", "log"),
            Expect("loss.finite", "eq", False),
            Expect("findings[0].code", "eq", "nonfinite_loss"),
        ],
    ),
    Scenario(
        id="fp16-overflow-points-to-mixed-precision",
        tool="check_gradients",
        arguments=_model("fp16_overflow", input_shape=[8, 16], input_dtype="float16"),
        expect=[
            Expect("nonfinite.dtype", "eq", "float16"),
            Expect("nonfinite.module", "eq", "0"),
            Expect("findings[*].code", "contains", "fp16_overflow"),
            Expect("findings[*].skill", "contains", "mixed-precision-and-optimization"),
        ],
    ),
    Scenario(
        id="unused-branch-never-runs",
        tool="check_gradients",
        arguments=_model("unused_branch"),
        expect=[
            Expect("unused_parameters", "eq", ["aux_head.weight", "aux_head.bias"]),
            Expect("graph_breaks[0].cause", "eq", "never_ran"),
            Expect("findings[0].code", "eq", "unused_parameters"),
            Expect("findings[0].skill", "eq", "module-design-patterns"),
        ],
    ),
    Scenario(
        id="detach-in-the-middle-is-not-an-unused-branch",
        tool="check_gradients",
        arguments=_model("detach_in_middle"),
        expect=[
            Expect("graph_breaks[*].cause", "eq", ["detached", "detached"]),
            Expect("graph_breaks[0].source", "not_null"),
            Expect("findings[*].code", "eq", ["graph_break_detach"]),
            Expect("unused_parameters", "contains", "encoder.0.weight"),
        ],
    ),
    Scenario(
        id="encoder-under-no-grad",
        tool="check_gradients",
        arguments=_model("encoder_under_no_grad"),
        expect=[Expect("findings[*].code", "eq", ["graph_break_no_grad"])],
    ),
    Scenario(
        id="frozen-backbone-is-only-noted",
        tool="check_gradients",
        arguments=_model("frozen_backbone"),
        expect=[
            Expect("frozen_parameters", "eq", ["0.weight", "0.bias"]),
            Expect("findings[*].severity", "eq", ["info"]),
        ],
    ),
    Scenario(
        id="everything-frozen-loss-has-no-grad",
        tool="check_gradients",
        arguments=_model("everything_frozen"),
        expect=[
            Expect("loss.requires_grad", "eq", False),
            Expect("findings[0].code", "eq", "loss_not_differentiable"),
        ],
    ),
    Scenario(
        id="exploding-init",
        tool="check_gradients",
        arguments=_model("exploding_init"),
        expect=[
            Expect("findings[*].code", "contains", "exploding_gradients"),
            Expect("total_grad_norm", "ge", 1e3),
        ],
    ),
    Scenario(
        id="vanishing-sigmoid-stack",
        tool="check_gradients",
        arguments=_model("vanishing_sigmoid"),
        expect=[
            Expect("depth_profile.trend", "eq", "vanishing"),
            Expect("depth_profile.first_to_last_ratio", "le", 1e-3),
            Expect("findings[*].code", "eq", ["vanishing_gradients"]),
        ],
    ),
    Scenario(
        id="dead-relus",
        tool="check_gradients",
        arguments=_model("dead_relu"),
        expect=[
            Expect("activations[0].module", "eq", "1"),
            Expect("activations[0].dead_unit_fraction", "eq", 1.0),
            Expect("findings[0].code", "eq", "dead_activations"),
            Expect("findings[0].severity", "eq", "error"),
            Expect("findings[*].code", "contains", "zero_gradients"),
        ],
    ),
    Scenario(
        id="custom-function-in-the-graph",
        tool="check_gradients",
        arguments=_model("model_with_custom_function"),
        expect=[
            Expect("custom_functions", "eq", [f"{ZOO}:BadSquare"]),
            Expect("findings[*].code", "eq", ["custom_function_in_graph"]),
        ],
    ),
    Scenario(
        id="gradcheck-finds-a-missing-factor",
        tool="check_gradients",
        arguments={"function": f"{ZOO}:BadSquare", "inputs": f"{ZOO}:square_inputs"},
        expect=[
            Expect("gradcheck.passed", "eq", False),
            Expect("gradcheck.worst_input", "eq", [0, 1, 0]),
            Expect("gradcheck.max_abs_error", "approx", 3.0, tolerance=1e-4),
            Expect("findings[0].code", "eq", "gradcheck_failed"),
            Expect("findings[0].skill", "eq", "custom-autograd-functions"),
        ],
    ),
    Scenario(
        id="padded-seq2seq-embeddings-are-not-vanishing-gradients",
        tool="check_gradients",
        arguments={"model": f"{REAL}:seq2seq_with_padding", "inputs": f"{REAL}:seq2seq_inputs"},
        expect=[
            Expect("depth_profile.trend", "eq", "stable"),
            Expect("depth_profile.trend_with_excluded", "eq", "vanishing"),
            Expect("findings[0].code", "eq", "by_design_zeros"),
            Expect("findings[0].severity", "eq", "info"),
            Expect("by_design_zeros[0].kind", "eq", "unused_embedding_rows"),
        ],
        description="rows no token looked up have zero gradient by design: an info note, no warning",
        slow=True,
    ),
    Scenario(
        id="layerdrop-skips-are-by-design",
        tool="check_gradients",
        arguments={"model": f"{REAL}:layerdrop_encoder", "input_shape": [2, 10, 32], "seed": 3},
        expect=[
            Expect("graph_breaks[0].cause", "eq", "stochastic_skip"),
            Expect("findings[0].code", "eq", "by_design_zeros"),
            Expect("findings[0].severity", "eq", "info"),
            Expect("by_design_zeros[0].module_type", "eq", "TransformerEncoderLayer"),
        ],
        description="a layer LayerDrop skipped this step runs with other seeds: not a branch to remove",
    ),
    Scenario(
        id="double-softmax-into-cross-entropy",
        tool="check_gradients",
        arguments={**BATCH, "model": f"{REAL}:classifier_with_softmax", "loss": f"{REAL}:cross_entropy_loss"},
        expect=[
            Expect("loss_inputs[0].problem", "eq", "double_softmax"),
            Expect("findings[0].code", "eq", "loss_on_probabilities"),
            Expect("findings[0].message", "contains", "pass the logits"),
        ],
    ),
    Scenario(
        id="sigmoid-before-bce-with-logits",
        tool="check_gradients",
        arguments={
            **BATCH,
            "model": f"{REAL}:classifier_with_sigmoid",
            "loss": f"{REAL}:bce_with_logits_loss",
        },
        expect=[
            Expect("loss_inputs[0].problem", "eq", "probabilities_into_bce_with_logits"),
            Expect("findings[0].code", "eq", "loss_on_probabilities"),
        ],
    ),
    Scenario(
        id="masked-mean-names-the-zero-divisor",
        tool="check_gradients",
        arguments={"model": f"{REAL}:masked_mean_pool", "inputs": f"{REAL}:masked_inputs"},
        expect=[
            Expect("nonfinite.op", "eq", "div"),
            Expect("nonfinite.cause", "contains", "is 0 in 3 of 8 rows"),
            Expect("findings[0].message", "contains", "clamp"),
        ],
    ),
    Scenario(
        id="infeasible-ctc-target-names-the-lengths",
        tool="check_gradients",
        arguments={
            "model": f"{REAL}:ctc_model",
            "inputs": f"{REAL}:audio_inputs",
            "loss": f"{REAL}:ctc_loss_with_long_targets",
        },
        expect=[
            Expect("nonfinite.op", "eq", "ctc_loss"),
            Expect("nonfinite.cause", "contains", "sample 1: input length 16 < target length 20"),
            Expect("findings[0].message", "contains", "zero_infinity=True"),
        ],
    ),
    Scenario(
        id="gradcheck-finds-a-wrong-transpose-on-input-1",
        tool="check_gradients",
        arguments={"function": f"{ZOO}:BadScaledMatmul", "inputs": f"{ZOO}:matmul_inputs"},
        expect=[Expect("gradcheck.passed", "eq", False), Expect("gradcheck.worst.input_tensor", "eq", 1)],
    ),
    Scenario(
        id="gradcheck-passes-a-correct-function",
        tool="check_gradients",
        arguments={"function": f"{ZOO}:GoodSquare", "input_shape": [3, 4], "gradgradcheck": True},
        expect=[
            Expect("gradcheck.passed", "eq", True),
            Expect("gradcheck.gradgradcheck_passed", "eq", True),
            Expect("findings", "eq", []),
        ],
    ),
    Scenario(
        id="gradcheck-on-a-plain-callable",
        tool="check_gradients",
        arguments={"function": f"{ZOO}:soft_clip", "input_shape": [5]},
        expect=[Expect("gradcheck.function_kind", "eq", "callable"), Expect("gradcheck.passed", "eq", True)],
    ),
    Scenario(
        id="model-outside-the-roots-is-refused",
        tool="check_gradients",
        arguments={"model": "/tmp/torch-skills-not-a-root/net.py:build", "input_shape": [2, 4]},
        expect_error="outside the allowed roots",
    ),
    Scenario(
        id="model-and-function-together-are-refused",
        tool="check_gradients",
        arguments={"model": f"{ZOO}:healthy_mlp", "function": f"{ZOO}:BadSquare", "input_shape": [3]},
        expect_error="give exactly one of model",
    ),
    Scenario(
        id="segfaulting-factory-is-a-clean-error",
        tool="check_gradients",
        arguments={"model": f"{FAULTS}:segfault", **BATCH},
        expect_error="SIGSEGV",
    ),
    Scenario(
        id="sys-exit-in-factory-is-a-clean-error",
        tool="check_gradients",
        arguments={"model": f"{FAULTS}:calls_sys_exit", **BATCH},
        expect_error="[sys_exit]",
    ),
    Scenario(
        id="endless-loop-stops-at-the-timeout",
        tool="check_gradients",
        arguments={"model": f"{FAULTS}:endless_loop", **BATCH, "timeout_s": 3},
        expect_error="[timeout]",
        slow=True,
    ),
]
