"""Losses fed probabilities where they expect logits, read from the autograd graph.

Use on the loss's graph before backward (the graph is freed after it):

    nodes, _ = graph_nodes(loss.grad_fn)      # torch_skills.gradients.trace
    problems = loss_inputs(nodes)             # list[LossInput], empty for a healthy loss

`F.cross_entropy` is `nll_loss(log_softmax(x))` in the graph (NllLossBackward0 <- LogSoftmaxBackward0),
`BCEWithLogitsLoss` is one BinaryCrossEntropyWithLogitsBackward0 node. What feeds those nodes is
read from the grad_fn names, not from variable or module names, skipping nodes that only change
the shape (view, permute, squeeze, a dtype cast):

- a softmax or sigmoid under the log_softmax (cross_entropy on probabilities) or under `log` of a
  softmax: a double softmax. Probabilities lie in [0, 1], so the second softmax sees nearly equal
  inputs; the loss stays near log(num_classes) and the gradient shrinks by orders of magnitude;
- a softmax or sigmoid straight into `nll_loss`, which expects log-probabilities;
- a sigmoid (or softmax) into `binary_cross_entropy_with_logits`, which applies its own sigmoid;
- log_softmax of a log_softmax (or of `log(softmax)`): harmless, since log_softmax is idempotent
  (same loss, same gradient), reported as info only.

Known limitations: only the graph's node names are read, so a softmax written by hand
(`x.exp() / x.exp().sum(-1, keepdim=True)`) is not recognised; only the first tensor input of each
loss node is followed.
"""

from __future__ import annotations

from typing import Any

from torch_skills.gradients.models import LossInput

NLL_NODES = ("NllLossBackward", "NllLoss2DBackward")
BCE_LOGITS_NODES = ("BinaryCrossEntropyWithLogitsBackward",)
# Nodes that change the shape or dtype, not the values: followed through.
SHAPE_NODES = (
    "ViewBackward",
    "ReshapeAliasBackward",
    "UnsafeViewBackward",
    "PermuteBackward",
    "TransposeBackward",
    "SqueezeBackward",
    "UnsqueezeBackward",
    "ExpandBackward",
    "CloneBackward",
    "ToCopyBackward",
    "SliceBackward",
    "SelectBackward",
    "AsStridedBackward",
)
# Nodes that turn scores into probabilities or log-probabilities, by their token.
NORMALIZERS = {
    "LogSoftmaxBackward": "log_softmax",
    "SoftmaxBackward": "softmax",
    "SigmoidBackward": "sigmoid",
    "LogSigmoidBackward": "log_sigmoid",
    "LogBackward": "log",
}
MAX_CHAIN = 4


def _base(name: str) -> str:
    return name.rstrip("0123456789")


def _first_input(node: Any) -> Any:
    for child, _ in node.next_functions:
        if child is not None:
            return child
    return None


def _feeding(node: Any) -> tuple[list[str], list[str]]:
    """(node names, normalizer tokens) feeding `node`, loss side first, up to the first other op."""
    names: list[str] = []
    tokens: list[str] = []
    current = _first_input(node)
    steps = 0
    while current is not None and steps < 32 and len(tokens) < MAX_CHAIN:
        steps += 1
        base = _base(current.name())
        if base in SHAPE_NODES:
            current = _first_input(current)
            continue
        token = NORMALIZERS.get(base)
        if token is None:
            break
        names.append(current.name())
        tokens.append(token)
        current = _first_input(current)
    # log(softmax(x)) is log_softmax(x); log(sigmoid(x)) is log_sigmoid(x)
    merged: list[str] = []
    i = 0
    while i < len(tokens):
        if tokens[i] == "log" and i + 1 < len(tokens) and tokens[i + 1] in ("softmax", "sigmoid"):
            merged.append("log_" + tokens[i + 1])
            i += 2
        else:
            merged.append(tokens[i])
            i += 1
    return names, merged


def classify(loss_node: str, tokens: list[str]) -> str | None:
    """The problem for a loss node fed by these normalizers (loss side first), or None."""
    probabilities = ("softmax", "sigmoid")
    if _base(loss_node) in BCE_LOGITS_NODES:
        return "probabilities_into_bce_with_logits" if tokens and tokens[0] in probabilities else None
    if not tokens:
        return None
    if tokens[0] in probabilities:
        return "probabilities_into_nll"
    if tokens[0] in ("log_softmax", "log_sigmoid") and len(tokens) > 1:
        if tokens[1] in probabilities:
            return "double_softmax"
        if tokens[1] in ("log_softmax", "log_sigmoid"):
            return "log_softmax_twice"
    return None


def loss_inputs(nodes: list[Any]) -> list[LossInput]:
    """Every NLL/cross-entropy or BCE-with-logits node among the graph's `nodes` fed by a softmax/sigmoid."""
    out = []
    for node in nodes:
        name = node.name()
        if _base(name) not in NLL_NODES + BCE_LOGITS_NODES:
            continue
        chain, tokens = _feeding(node)
        problem = classify(name, tokens)
        if problem is not None:
            out.append(LossInput(loss_node=name, chain=chain, problem=problem))  # type: ignore[arg-type]
    return out
