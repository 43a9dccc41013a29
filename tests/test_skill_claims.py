"""Factual claims the skills make about torch, checked against the installed torch on CPU.

Each test pins one statement an expert review found wrong or misleading (issue 15), so a skill
edit or a torch upgrade that makes it false again fails here. Run: pytest -q tests/test_skill_claims.py
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
from torch.autograd.function import once_differentiable

from torch_skills.skillpack.codeblocks import python_blocks
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR

SKILLS = Path(DEFAULT_SKILLS_DIR)


def _pack_text_files() -> list[Path]:
    """Every Markdown file of the pack."""
    return sorted(SKILLS.rglob("*.md"))


# -- checkpointing: RNG states and map_location -------------------------------------------------
def test_an_rng_state_loaded_onto_another_device_cannot_be_set(tmp_path: Path):
    """map_location moves the saved CPU generator state too, and torch.set_rng_state refuses it."""
    torch.save({"rng": torch.get_rng_state()}, tmp_path / "ckpt.pt")
    moved = torch.load(tmp_path / "ckpt.pt", map_location="meta", weights_only=True)["rng"]
    assert moved.device.type == "meta"
    with pytest.raises(TypeError, match="ByteTensor"):
        torch.set_rng_state(moved)
    kept = torch.load(tmp_path / "ckpt.pt", map_location="cpu", weights_only=True)["rng"]
    torch.set_rng_state(kept)  # the skills' way: load RNG states on the CPU


def test_every_skill_block_that_restores_rng_loads_on_the_cpu():
    """A block that calls torch.set_rng_state after torch.load loads with map_location='cpu'."""
    offenders = []
    for block in python_blocks([SKILLS]):
        if "set_rng_state(" not in block.code or "torch.load(" not in block.code:
            continue
        for call in re.findall(r"torch\.load\([^)]*\)", block.code):
            if 'map_location="cpu"' not in call:
                offenders.append(f"{block.where}: {call}")
    assert not offenders, "RNG states must be loaded on the CPU:\n" + "\n".join(offenders)


def test_optimizer_load_state_dict_moves_moments_to_the_parameters_device():
    """Loading on the CPU is enough: Optimizer.load_state_dict casts state to each param's device/dtype."""
    p = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones_like(p)
    opt.step()
    state = opt.state_dict()
    state["state"][0]["exp_avg"] = state["state"][0]["exp_avg"].float()
    fresh = torch.optim.AdamW([p])
    fresh.load_state_dict(state)
    assert fresh.state[p]["exp_avg"].dtype == torch.float64


# -- custom autograd: once_differentiable ---------------------------------------------------------
class _OpaqueSquare(torch.autograd.Function):
    """x**2 whose backward is marked once-differentiable, as an opaque kernel would be."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return 2 * x * grad_out


def _gradient_penalty_grad(square) -> torch.Tensor:
    w = torch.tensor([1.5], requires_grad=True)
    x = torch.tensor([2.0, -1.0], requires_grad=True)
    out = square(w * x).sum()
    (gx,) = torch.autograd.grad(out, x, create_graph=True)
    (gx**2).sum().backward()
    return w.grad


def test_once_differentiable_silently_drops_the_second_order_term_of_a_gradient_penalty():
    """With a constant incoming gradient nothing raises, and d(penalty)/dw is half the true value."""
    true = _gradient_penalty_grad(lambda t: t * t)
    wrong = _gradient_penalty_grad(_OpaqueSquare.apply)
    assert torch.allclose(true, torch.tensor([270.0]))
    assert torch.allclose(wrong, torch.tensor([135.0]))  # silently wrong, no error


def test_once_differentiable_raises_only_when_the_incoming_gradient_requires_grad():
    """When layers after the Function depend on parameters, double backward raises instead."""
    w = torch.tensor([1.5], requires_grad=True)
    x = torch.tensor([2.0, -1.0], requires_grad=True)
    out = (_OpaqueSquare.apply(w * x) * w).sum()
    (gx,) = torch.autograd.grad(out, x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        (gx**2).sum().backward()


def test_the_skills_no_longer_promise_that_once_differentiable_always_raises():
    """The custom-autograd skill says the silent case exists."""
    text = (SKILLS / "custom-autograd-functions" / "SKILL.md").read_text()
    assert "silently dropped" in text
    assert "instead of returning a silently wrong value" not in text


# -- optimizer state dtype --------------------------------------------------------------------------
@pytest.mark.parametrize("impl", [{"foreach": False}, {"foreach": True}, {"fused": True}])
def test_adamw_moments_for_bf16_parameters_are_bf16(impl: dict[str, bool]):
    """AdamW creates exp_avg/exp_avg_sq with zeros_like(param): bf16 params get bf16 state."""
    p = torch.nn.Parameter(torch.randn(8, dtype=torch.bfloat16))
    opt = torch.optim.AdamW([p], **impl)
    p.grad = torch.randn_like(p)
    opt.step()
    state = opt.state[p]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    assert state["step"].dtype == torch.float32


def test_fused_adamw_runs_on_cpu():
    """The training script's fused=True on CPU is supported in this torch (no fallback needed)."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    assert opt.param_groups[0]["fused"] is True


# -- autocast --------------------------------------------------------------------------------------
def test_bf16_autocast_saves_a_bf16_copy_of_the_weight_for_backward():
    """The memory arithmetic's extra 2 B/param: linear under autocast saves the cast weight."""
    layer = torch.nn.Linear(64, 32)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    hidden = torch.randn(16, 64, requires_grad=True)  # an activation: it needs a gradient too
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        layer(hidden).sum()
    weight_copies = [t for t in saved if t.shape == layer.weight.T.shape]
    assert weight_copies and all(t.dtype == torch.bfloat16 for t in weight_copies)
    assert layer.weight.dtype == torch.float32  # the fp32 weight lives on beside its copy


def test_sdpa_runs_in_the_autocast_dtype():
    """SDPA is on the lower-precision autocast list (CPU here; the CUDA list is checked below)."""
    q = k = v = torch.randn(1, 2, 8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert out.dtype == torch.bfloat16


def _header_list(header: str, macro: str) -> set[str]:
    body = header.split(f"#define {macro}(_)", 1)[1].split("#define", 1)[0]
    return set(re.findall(r"_\((\w+)", body))


def _reference_list(text: str, heading: str) -> set[str]:
    para = text.split(heading, 1)[1].split("\n\n", 1)[0]
    return {n for n in re.findall(r"`(\w+)`", para)}


def test_the_cuda_autocast_lists_in_the_reference_match_the_installed_header():
    """The CUDA lower-precision and fp32 lists are those of ATen/autocast_mode.h in this wheel."""
    header_path = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header_path.exists():
        pytest.skip("this torch wheel ships no ATen headers")
    header = header_path.read_text()
    ref = (
        SKILLS / "mixed-precision-and-optimization" / "references" / "autocast-and-grad-scaler.md"
    ).read_text()
    lower = _header_list(header, "AT_FORALL_LOWER_PRECISION_FP")
    assert "scaled_dot_product_attention" in lower
    assert _reference_list(ref, "**Cast to fp16/bf16**:") == lower
    fp32 = _header_list(header, "AT_FORALL_FP32")
    listed = _reference_list(ref, "**Cast to fp32**:")
    assert listed <= fp32 and fp32 - listed <= {n for n in fp32 if n.startswith(("upsample", "_upsample"))}
    assert _reference_list(ref, "**Promote to the widest input type**:") == _header_list(
        header, "AT_FORALL_PROMOTE"
    )


def test_is_bf16_supported_counts_emulation_unless_told_not_to():
    """The default including_emulation=True answers True on GPUs that only emulate bf16."""
    param = inspect.signature(torch.cuda.is_bf16_supported).parameters["including_emulation"]
    assert param.default is True
    text = (SKILLS / "mixed-precision-and-optimization" / "SKILL.md").read_text()
    assert "is_bf16_supported(including_emulation=False)" in text


# -- NaN checks ------------------------------------------------------------------------------------
def test_nan_to_num_hides_a_nan_instead_of_detecting_it():
    """After nan_to_num the tensor passes an isfinite check although its input was NaN."""
    loss = torch.tensor([1.0, float("nan"), float("inf")])
    assert not torch.isfinite(loss).all()
    assert torch.isfinite(torch.nan_to_num(loss)).all()


def test_no_skill_offers_nan_to_num_as_a_check():
    """nan_to_num appears only as the thing not to do."""
    for path in _pack_text_files():
        for line in path.read_text().splitlines():
            if "nan_to_num" in line:
                assert re.search(r"hide|not a test|Not `torch.nan_to_num`", line, re.I), f"{path}: {line}"


# -- API names -------------------------------------------------------------------------------------
_CUDA_BUILD_ONLY = re.compile(r"^torch\._C\._cuda")  # bindings compiled only into CUDA wheels


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:  # noqa: BLE001 - not a module at this depth: try a shorter prefix
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_torch_name_the_skills_mention_exists_in_the_installed_torch():
    """Each dotted torch.* name in the skills' text and code resolves (no renamed or removed APIs)."""
    names = {
        m.group(0)
        for path in _pack_text_files()
        for m in re.finditer(r"\btorch(?:\.[A-Za-z_]\w*)+", path.read_text())
    }
    missing = sorted(n for n in names if not _CUDA_BUILD_ONLY.match(n) and not _resolves(n))
    assert not missing, f"names that do not exist in torch {torch.__version__}: {missing}"


def test_cross_skill_references_name_files_that_exist():
    """'the `X` skill's `references/Y.md`' and 'X/references/Y.md' point at real files."""
    pattern = re.compile(
        r"`([a-z-]+)` skill's\s+`?(references/[\w-]+\.md)|\b([a-z-]+)/(references/[\w-]+\.md)"
    )
    broken = []
    for path in _pack_text_files():
        for m in pattern.finditer(path.read_text()):
            skill, ref = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            if not (SKILLS / skill / ref).is_file():
                broken.append(f"{path.relative_to(SKILLS)}: {skill}/{ref}")
    assert not broken, broken


# -- tools woven into the skills ---------------------------------------------------------------------
WHAT_IF_OPTIONS = {
    "check_gradients": ["gradgradcheck", "function", "input_dtype", "model_kwargs"],
    "estimate_memory": [
        "activation_checkpointing",
        "precision",
        "gradient_accumulation",
        "batch_size",
        "device_memory_gib",
        "sharding",
    ],
    "profile_model": ["data", "compile", "trace_path", "precision"],
    "verify_checkpoint": ["load_and_run", "model"],
}


@pytest.mark.parametrize(
    ("tool", "option"), [(t, o) for t, options in WHAT_IF_OPTIONS.items() for o in options]
)
def test_a_specialist_skill_shows_the_tool_call_with_each_what_if_option(tool: str, option: str):
    """Each tool option that answers a decision appears in a call written out in a specialist skill."""
    call = re.compile(rf"{tool}\([^)]*\b{option}=", re.S)
    files = [p for p in _pack_text_files() if "using-pytorch-engineering" not in p.parts]
    assert any(call.search(p.read_text()) for p in files), f"no `{tool}(..., {option}=...)` in the skills"


# -- one home per table and example ----------------------------------------------------------------
def test_the_compile_modes_table_has_one_home():
    """Only torch-compile.md tabulates the compile modes; other skills link to it."""
    homes = [
        p.relative_to(SKILLS).as_posix()
        for p in _pack_text_files()
        if re.search(r"^\|\s*`\"?max-autotune\"?`\s*\|", p.read_text(), re.M)
    ]
    assert homes == ["mixed-precision-and-optimization/references/torch-compile.md"], homes


def test_the_fsdp2_dcp_round_trip_example_has_one_home():
    """One runnable get_state_dict + dcp.save + dcp.load example; the other places link to it."""
    homes = [
        b.where
        for b in python_blocks([SKILLS])
        if all(s in b.code for s in ("get_state_dict(", "dcp.save(", "dcp.load("))
    ]
    assert len(homes) == 1 and "distributed-checkpoint.md" in homes[0], homes
