"""What an op's operands held when it made a NaN/Inf, measured, and the fix for that op.

Use from the tracer when an op turns finite inputs into NaN/Inf:

    cause, fix = operand_cause("div", args, kwargs)   # ('the divisor (the right-hand operand, ...) is 0 ...', ...)

Ops covered: division (which operand holds the zeros, and whether the numerator is 0 there too),
`log` of zero or negative values, `sqrt`/`rsqrt` of negative values, `pow` with a negative
exponent at 0, and `ctc_loss` with samples whose target cannot fit in the input (each target label
needs a frame, and a repeated label needs a blank frame between its copies). Other ops return
(None, None) and the generic advice stands. Backward: `backward_cause` reads the saved output of a
SqrtBackward0 node (its gradient 1/(2*sqrt(x)) is infinite where sqrt(x) is 0).

Known limitations: operands are read positionally or by the keyword torch's signature gives them;
an op called through a wrapper that renames its arguments is not explained.
"""

from __future__ import annotations

from typing import Any

import torch

DIV_OPS = frozenset({"div", "div_", "true_divide", "true_divide_", "__truediv__", "__itruediv__"})
RDIV_OPS = frozenset({"__rtruediv__"})
LOG_OPS = frozenset({"log", "log_", "log2", "log10", "log2_", "log10_"})
SQRT_OPS = frozenset({"sqrt", "sqrt_", "rsqrt", "rsqrt_"})
POW_OPS = frozenset({"pow", "pow_", "__pow__"})


def _tensor(x: Any) -> torch.Tensor | None:
    return x if isinstance(x, torch.Tensor) else None


def _arg(args: tuple, kwargs: dict, index: int, *names: str) -> Any:
    if len(args) > index:
        return args[index]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return None


def _shape(t: torch.Tensor) -> str:
    return str(list(t.shape))


def _rows(mask: torch.Tensor) -> str:
    """'at 2 of 8 entries', or with 2+ dims 'in 2 of 8 rows (3 entries)'."""
    entries = int(mask.sum())
    if mask.dim() >= 2 and mask.shape[0] > 1:
        rows = int(mask.flatten(1).any(dim=1).sum())
        return f"in {rows} of {mask.shape[0]} rows ({entries} of {mask.numel()} entries)"
    return f"at {entries} of {mask.numel()} entries"


def operand_cause(name: str, args: tuple, kwargs: dict) -> tuple[str | None, str | None]:
    """(what the operands held, the fix) for an op that made a NaN/Inf from finite inputs."""
    with torch.no_grad():
        if name in DIV_OPS or name in RDIV_OPS:
            return _division(name, args, kwargs)
        if name in LOG_OPS:
            return _log(name, args, kwargs)
        if name in SQRT_OPS:
            return _sqrt(name, args, kwargs)
        if name in POW_OPS:
            return _pow(args, kwargs)
        if name == "ctc_loss":
            return _ctc(args, kwargs)
    return None, None


def _division(name: str, args: tuple, kwargs: dict) -> tuple[str | None, str | None]:
    if name in RDIV_OPS:  # 1 / x: args = (x, 1)
        numerator, divisor = _arg(args, kwargs, 1, "other"), _arg(args, kwargs, 0, "input", "self")
    else:
        numerator, divisor = _arg(args, kwargs, 0, "input", "self"), _arg(args, kwargs, 1, "other")
    d = _tensor(divisor)
    if d is None:
        if divisor == 0:
            return "the divisor is the Python number 0", "Divide by a non-zero number."
        return None, None
    zero = d.detach() == 0
    if not bool(zero.any()):
        return None, None
    text = f"the divisor (the right-hand operand, shape {_shape(d)}) is 0 {_rows(zero)}"
    n = _tensor(numerator)
    if n is not None:
        try:
            both = (n.detach() == 0) & zero  # broadcast as the division did
        except RuntimeError:
            both = None
        if both is not None and bool(both.any()):
            text += f", where the numerator is 0 too at {int(both.sum())} entries (0/0 = NaN; x/0 = Inf)"
    fix = (
        "Keep the divisor away from 0: clamp it (`d.clamp_min(eps)`), add an eps (`d + eps`), or mask the rows "
        "whose divisor is 0 (an empty or all-padding row); for a norm use F.normalize(x, dim=..., eps=...)."
    )
    return text, fix


def _log(name: str, args: tuple, kwargs: dict) -> tuple[str | None, str | None]:
    x = _tensor(_arg(args, kwargs, 0, "input", "self"))
    if x is None:
        return None, None
    d = x.detach()
    zeros, negative = int((d == 0).sum()), int((d < 0).sum())
    if zeros == 0 and negative == 0:
        return None, None
    parts = []
    if zeros:
        parts.append(f"0 at {zeros} entries (log gives -inf)")
    if negative:
        parts.append(f"negative at {negative} entries, min {float(d.min()):.3g} (log gives NaN)")
    text = f"`{name}`'s input (shape {_shape(x)}) is " + " and ".join(parts) + f" of {d.numel()}"
    fix = (
        "Keep the log's input positive: `x.clamp_min(eps).log()`, log1p for log(1 + x), and for log of "
        "probabilities work on logits (F.log_softmax, F.logsigmoid, the *_with_logits losses)."
    )
    return text, fix


def _sqrt(name: str, args: tuple, kwargs: dict) -> tuple[str | None, str | None]:
    x = _tensor(_arg(args, kwargs, 0, "input", "self"))
    if x is None:
        return None, None
    d = x.detach()
    negative = int((d < 0).sum())
    zeros = int((d == 0).sum()) if name.startswith("rsqrt") else 0
    if negative == 0 and zeros == 0:
        return None, None
    parts = []
    if negative:
        parts.append(f"negative at {negative} entries, min {float(d.min()):.3g} (NaN)")
    if zeros:
        parts.append(f"0 at {zeros} entries (rsqrt gives Inf)")
    text = f"`{name}`'s input (shape {_shape(x)}) is " + " and ".join(parts) + f" of {d.numel()}"
    fix = (
        "Keep the input non-negative before the root: `x.clamp_min(0)` (or `x.clamp_min(eps)`, which also keeps "
        "the gradient finite); a variance computed as E[x^2] - E[x]^2 goes slightly negative by rounding: use "
        "torch.var or clamp it."
    )
    return text, fix


def _pow(args: tuple, kwargs: dict) -> tuple[str | None, str | None]:
    base = _tensor(_arg(args, kwargs, 0, "input", "self"))
    exponent = _arg(args, kwargs, 1, "exponent")
    if base is None or not isinstance(exponent, (int, float)):
        return None, None
    d = base.detach()
    if exponent < 0 and bool((d == 0).any()):
        return (
            f"the base (shape {_shape(base)}) is 0 at {int((d == 0).sum())} entries with exponent {exponent}",
            "Keep the base away from 0 (`x.clamp_min(eps) ** p`) or mask those entries.",
        )
    if exponent != int(exponent) and bool((d < 0).any()):
        return (
            f"the base (shape {_shape(base)}) is negative at {int((d < 0).sum())} entries with the fractional "
            f"exponent {exponent}",
            "Clamp the base to be non-negative, or use `x.abs() ** p * x.sign()` if a signed power is meant.",
        )
    return None, None


def _ctc(args: tuple, kwargs: dict) -> tuple[str | None, str | None]:
    log_probs = _tensor(_arg(args, kwargs, 0, "log_probs"))
    targets = _tensor(_arg(args, kwargs, 1, "targets"))
    input_lengths = _arg(args, kwargs, 2, "input_lengths")
    target_lengths = _arg(args, kwargs, 3, "target_lengths")
    if log_probs is None or targets is None or input_lengths is None or target_lengths is None:
        return None, None
    in_len = torch.as_tensor(input_lengths).flatten().tolist()
    tg_len = torch.as_tensor(target_lengths).flatten().tolist()
    if len(in_len) != len(tg_len):
        return None, None
    t = targets.detach().cpu()
    offsets = [0]
    for n in tg_len:
        offsets.append(offsets[-1] + int(n))
    bad = []
    for i, (t_in, t_len) in enumerate(zip(in_len, tg_len, strict=True)):
        row = t[i, : int(t_len)] if t.dim() == 2 else t[offsets[i] : offsets[i + 1]]
        repeats = int((row[1:] == row[:-1]).sum()) if row.numel() > 1 else 0
        if int(t_in) < int(t_len) + repeats:
            bad.append((i, int(t_in), int(t_len), repeats))
    if not bad:
        return None, None
    shown = "; ".join(
        f"sample {i}: input length {t_in} < target length {t_len}" + (f" + {r} repeats" if r else "")
        for i, t_in, t_len, r in bad[:4]
    )
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    text = (
        f"{len(bad)} of {len(in_len)} samples have a target that cannot fit in its input (each label needs a "
        f"frame, a repeated label a blank between): {shown}{more}; CTC's loss is +inf for them"
    )
    fix = (
        "Fix the lengths: pass input_lengths after the model's downsampling (not the raw audio length), or use "
        "less downsampling, or drop samples whose target is too long for their input. zero_infinity=True "
        "(nn.CTCLoss(zero_infinity=True); config.ctc_zero_infinity=True in Hugging Face CTC models) only zeroes "
        "those samples' loss and gradient, so they train nothing."
    )
    return text, fix


def backward_cause(node: Any) -> tuple[str | None, str | None]:
    """(cause, fix) for an autograd node that made a NaN/Inf gradient, from what it saved."""
    if node.name().startswith("SqrtBackward"):
        result = getattr(node, "_saved_result", None)
        if isinstance(result, torch.Tensor):
            zeros = int((result.detach() == 0).sum())
            if zeros:
                return (
                    f"sqrt's output is 0 at {zeros} of {result.numel()} entries, where its gradient "
                    "1/(2*sqrt(x)) is infinite",
                    "Put the eps inside the root (`torch.sqrt(x + eps)` or `x.clamp_min(eps).sqrt()`), not after "
                    "it; for a norm use torch.linalg.vector_norm, whose gradient at 0 is defined.",
                )
    return None, None
