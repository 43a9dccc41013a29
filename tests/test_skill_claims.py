"""Factual claims the skills make about torch, checked against the installed torch on CPU.

Each test pins one statement an expert review found wrong or misleading (issues 15 and 27), so a skill
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
_CPU_WHEEL = pytest.mark.skipif(
    torch.version.cuda is not None or torch.version.hip is not None,
    reason="states what a CPU-only wheel shows",
)


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
    "check_distributed": ["strategy", "data", "loss", "hang_timeout_s"],
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


# == issue 27: the third review ===================================================================
# CUDA-only facts, cited to the source they come from (no CPU test can show them):
# - cuDNN SDPA first on sm90/sm100: aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
#   check_prefer_cudnn_attention() (cuDNN >= 9.15.1, major 9 or 10, TORCH_CUDNN_SDPA_DEPRIORITIZED
#   unset) and priority_order(), which then installs {cudnn, flash, efficient, math}.
#   Still so in the 2.15.0 cu132 wheel: libtorch_cuda.so holds check_prefer_cudnn_attention and the
#   TORCH_CUDNN_SDPA_DEPRIORITIZED string, and torch.backends.cudnn.version() is 92600.
# - flash refuses is_causal with L != S: same file, check_flash_causal_non_square_seqlens().
# - a misspelled PYTORCH_CUDA_ALLOC_CONF key raises on CUDA builds: c10/cuda/CUDAAllocatorConfig.cpp,
#   CUDAAllocatorConfig::parseArgs, TORCH_CHECK_VALUE(... "Unrecognized key '", key,
#   "' in CUDA allocator config.").
#   The 2.15.0 cu132 wheel's libc10_cuda.so still holds "Unrecognized key '" / "' in CUDA allocator config.".
# - float8 training saves high-precision tensors: torchao/float8/float8_linear.py,
#   matmul_with_hp_or_float8_args.forward, ctx.save_for_backward(input_hp, weight_hp_t).
# - Int4WeightOnlyConfig's default (version 2, "plain") needs mslk: torchao/quantization/
#   quantize_/workflows/int4/int4_tensor.py, ImportError("Requires mslk >= 1.0.0").
# - tensor cores for any size: cuBLAS 11+ no longer requires multiples of 8 (NVIDIA "Matrix
#   Multiplication Background User's Guide", "Tensor Core Requirements"); alignment is speed.
# - nsys --sample takes process-tree|system-wide|none (Nsight Systems user guide, CLI options).
def _ref(skill: str, name: str) -> str:
    return (SKILLS / skill / "references" / name).read_text()


def _attention(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=gen) for s in shapes]


def test_is_causal_is_top_left_aligned_so_a_decode_step_sees_only_key_zero():
    """With one query and six keys, is_causal=True attends to key 0 alone: silently wrong for decoding."""
    F = torch.nn.functional
    q, k, v = _attention((1, 2, 1, 8), (1, 2, 6, 8), (1, 2, 6, 8))
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True), v[:, :, :1])
    text = _ref("performance-profiling", "attention.md")
    assert "is_causal=False" in text and "causal_lower_right" in text


def test_causal_lower_right_gives_a_chunk_the_rows_of_full_causal_attention():
    """For chunked prefill the bottom-right-aligned mask reproduces the last rows of full attention."""
    from torch.nn.attention.bias import causal_lower_right

    F = torch.nn.functional
    q, k, v = _attention((1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    chunk = F.scaled_dot_product_attention(q[:, :, -3:], k, v, attn_mask=causal_lower_right(3, 6))
    torch.testing.assert_close(chunk, full[:, :, -3:])


def test_the_attention_reference_puts_cudnn_first_on_hopper_and_names_the_switch_back():
    """cuDNN SDPA is the default first choice on sm90/sm100, not opt-in (see the citation above)."""
    text = _ref("performance-profiling", "attention.md")
    assert "cuDNN runs only when you ask for it" not in text
    assert "TORCH_CUDNN_SDPA_DEPRIORITIZED=1" in text and "sm90, sm100" in text
    assert hasattr(torch.nn.attention.SDPBackend, "CUDNN_ATTENTION")


def test_int4_weight_only_is_never_shown_with_the_packing_that_needs_mslk():
    """Every Int4WeightOnlyConfig in the skills names a packing PyTorch ships a kernel for, except
    where the sentence quotes the bare call to say it fails without mslk."""
    for path in _pack_text_files():
        text = path.read_text()
        for m in re.finditer(r"Int4WeightOnlyConfig\(([^)]*)\)", text):
            warned = "mslk" in text[m.end() : m.end() + 120]
            assert "int4_packing_format" in m.group(1) or warned, f"{path}: {m.group(0)} raises without mslk"
    assert "Requires mslk >= 1.0.0" in _ref(
        "mixed-precision-and-optimization", "quantization-and-low-memory-optimizers.md"
    )


def test_the_default_device_is_where_tensors_go_not_which_accelerator_exists():
    """get_default_device is a setting (cpu until set); current_accelerator answers 'which GPU'."""
    assert torch.get_default_device().type == "cpu"
    torch.set_default_device("meta")
    try:
        assert torch.get_default_device().type == "meta" and torch.empty(1).is_meta
    finally:
        torch.set_default_device(None)
    if not torch.accelerator.is_available():  # CI: no GPU, whatever the wheel was built for
        assert torch.accelerator.current_accelerator(check_available=True) is None
    if torch.version.cuda is None and torch.version.hip is None:
        assert torch.accelerator.current_accelerator() is None  # a CPU-only wheel
    text = _ref("tensor-operations-and-memory", "mps-and-rocm.md")
    assert "give the same\nanswer" not in text and "not which accelerator exists" in text


def test_the_skills_ask_current_accelerator_to_check_availability():
    """Without check_available=True a CUDA wheel on a machine with no GPU still answers cuda."""
    assert (
        inspect.signature(torch.accelerator.current_accelerator).parameters["check_available"].default
        is False
    )
    calls = [
        c for p in _pack_text_files() for c in re.findall(r"current_accelerator\([^)]*\)", p.read_text())
    ]
    assert calls and all("check_available=True" in c for c in calls), calls


@_CPU_WHEEL
def test_the_device_block_reports_a_cpu_only_build_instead_of_cuda_none():
    """The build string comes out 'CPU-only', never 'CUDA None', on a wheel without CUDA."""
    import contextlib
    import io

    block = next(
        b
        for b in python_blocks([SKILLS / "tensor-operations-and-memory" / "references" / "mps-and-rocm.md"])
        if "def build()" in b.code
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, block.where, "exec"), {"__name__": "__main__"})
    assert torch.version.cuda is None and "CPU-only" in out.getvalue() and "None" not in out.getvalue()


def test_aot_eager_adds_no_decompositions_and_the_bisector_tries_decompositions_next():
    """aot_eager passes no decomposition table; aot_eager_decomp_partition does, and the bisector
    walks eager, aot_eager, aot_eager_decomp_partition, ..., inductor in that order."""
    from torch._dynamo.backends import debugging
    from torch._inductor.compiler_bisector import BACKENDS

    assert "decompositions" not in inspect.getsource(debugging.aot_eager)
    assert "decompositions" in inspect.getsource(debugging.aot_eager_decomp_partition)
    order = list(BACKENDS)
    assert order[:3] == ["eager", "aot_eager", "aot_eager_decomp_partition"] and order[-1] == "inductor"
    text = _ref("debugging-techniques", "compiled-vs-eager.md")
    assert "backward graphs and decompositions" not in text and "compiler_bisector" in text


def test_float8_training_is_not_sold_as_an_activation_memory_saving():
    """The table row says float8 training shrinks nothing (citation above)."""
    text = _ref("mixed-precision-and-optimization", "quantization-and-low-memory-optimizers.md")
    row = next(line for line in text.splitlines() if line.startswith("| float8 training"))
    assert "saved in fp8" not in row and "nothing" in row


def test_make_graphed_callables_refuses_autocast_with_its_cache_on():
    """The check runs before any CUDA work, so the CPU build shows it; cache_enabled=False passes it."""
    layer, sample = torch.nn.Linear(2, 2), (torch.randn(1, 2),)
    torch.set_autocast_enabled("cuda", True)
    try:
        with pytest.raises(RuntimeError, match="does not support the autocast caching"):
            torch.cuda.make_graphed_callables(layer, sample)
        torch.set_autocast_cache_enabled(False)
        with pytest.raises(RuntimeError) as past_the_check:  # fails later, for want of a GPU
            torch.cuda.make_graphed_callables(layer, sample)
        assert "autocast caching" not in str(past_the_check.value)
    finally:
        torch.set_autocast_enabled("cuda", False)
        torch.set_autocast_cache_enabled(True)
    assert "cache_enabled=False" in _ref("performance-profiling", "cuda-graphs.md")


def test_nsys_is_shown_with_a_sample_value_current_nsys_accepts():
    """`--sample=cpu` appears only in the sentence that says it is no longer accepted."""
    text = _ref("performance-profiling", "nvtx-and-nsys.md")
    assert re.findall(r"--sample=(\S+)", text) == ["process-tree", "cpu`"]
    assert "not accepted" in text


def test_adafactor_in_torch_optim_keeps_no_first_moment_at_all():
    """No beta1/momentum argument, and the state after a step holds no exp_avg."""
    assert not {"beta1", "betas", "momentum"} & set(inspect.signature(torch.optim.Adafactor).parameters)
    layer = torch.nn.Linear(4, 8, bias=False)
    opt = torch.optim.Adafactor(layer.parameters())
    layer(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert set(opt.state[layer.weight]) == {"step", "row_var", "col_var"}
    text = _ref("mixed-precision-and-optimization", "quantization-and-low-memory-optimizers.md")
    assert "no first moment by default" not in text


def test_as_tensor_returns_the_tensor_itself_without_the_copy_construct_warning():
    """torch.tensor(t) and t.new_tensor(t) warn; torch.as_tensor(t) is t, silently."""
    import warnings

    t = torch.ones(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.as_tensor(t) is t
    for copy in (torch.tensor, t.new_tensor):
        with pytest.warns(UserWarning, match="copy construct"):
            copy(t)
    assert "`torch.as_tensor(t)` does not warn" in _ref("tensor-operations-and-memory", "views-and-copies.md")


def test_dtype_methods_return_self_when_the_dtype_already_matches():
    """.double() on float64 and .half() on float16 are no-ops, not copies."""
    d, h = torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float16)
    assert d.double() is d and h.half() is h and d.float() is not d
    text = _ref("tensor-operations-and-memory", "views-and-copies.md")
    assert "return `self` when the dtype already matches" in text


def _counting_backend():
    compiles: list[list[tuple[int, ...]]] = []
    calls: list[int] = []

    def backend(gm, example_inputs):
        compiles.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])

        def run(*args):
            calls.append(1)
            return gm.forward(*args)

        return run

    return backend, compiles, calls


def test_past_the_recompile_limit_only_inputs_no_entry_accepts_run_eagerly():
    """A shape seen before still runs its compiled entry after the limit is hit."""
    backend, compiles, calls = _counting_backend()
    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 2, backend=backend, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2):
        f(torch.ones(2))
        f(torch.ones(3))
        f(torch.ones(4))  # a third shape: over the limit, runs eagerly
        assert (len(compiles), len(calls)) == (2, 2)
        f(torch.ones(2))  # the first entry's guards accept it: compiled
        assert (len(compiles), len(calls)) == (2, 3)
    torch._dynamo.reset()
    text = _ref("mixed-precision-and-optimization", "torch-compile.md")
    assert "it now runs eagerly" not in text and "silently runs eagerly" not in text


def test_a_cache_grown_with_cat_recompiles_once_then_runs_dynamic():
    """Automatic dynamic: six cache lengths cost two compiles, not six."""
    backend, compiles, _ = _counting_backend()
    torch._dynamo.reset()
    step = torch.compile(lambda cache, new: torch.cat([cache, new], dim=1), backend=backend)
    cache = torch.zeros(1, 1, 4)
    for _ in range(6):
        cache = step(cache, torch.ones(1, 1, 4))
    assert cache.shape == (1, 7, 4) and len(compiles) == 2
    torch._dynamo.reset()
    assert "recompiles only once" in _ref("performance-profiling", "attention.md")


def test_grad_scaler_is_enabled_under_bf16_too_and_scales_by_65536():
    """GradScaler does not look at the autocast dtype: it scales a bf16-autocast loss all the same."""
    scaler = torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.Linear(4, 1)(torch.randn(2, 4)).float().sum()
    assert scaler.is_enabled()
    torch.testing.assert_close(scaler.scale(loss), loss * 65536.0)
    assert (
        "only active with fp16" not in (SKILLS / "checkpointing-and-reproducibility" / "SKILL.md").read_text()
    )


@pytest.mark.parametrize(
    ("shape", "raises"), [((1, 4), True), ((1, 4, 1, 1), True), ((1, 4, 3, 3), False), ((2, 4), False)]
)
def test_batchnorm_raises_only_for_one_value_per_channel(shape: tuple[int, ...], raises: bool):
    """Batch 1 alone is not the trigger: a batch of 1 image with a 3x3 map trains."""
    bn = (torch.nn.BatchNorm1d if len(shape) == 2 else torch.nn.BatchNorm2d)(4).train()
    if raises:
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            bn(torch.randn(*shape))
    else:
        bn(torch.randn(*shape))
    assert (
        "BatchNorm with one value per channel" in (SKILLS / "module-design-patterns" / "SKILL.md").read_text()
    )


def test_force_no_weights_only_load_changes_only_calls_that_do_not_choose(tmp_path: Path, monkeypatch):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD flips the default; an explicit weights_only=True still refuses."""
    import operator

    torch.save({"fn": operator.add}, tmp_path / "code.pt")  # a global weights_only refuses
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "code.pt", weights_only=True)
    with pytest.warns(UserWarning, match="forcing weights_only=False"):
        assert torch.load(tmp_path / "code.pt")["fn"] is operator.add  # our own file: trusted
    text = _ref("checkpointing-and-reproducibility", "safe-loading-and-formats.md")
    assert "explicit `weights_only=True` still wins" in text


def test_a_cpu_wheel_ignores_a_misspelled_allocator_key_and_the_skill_says_cuda_rejects_it():
    """CPU: imports and allocates with the typo (CUDA's rejection is cited above)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:True"}
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.zeros(4).sum().item())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "0.0"
    text = _ref("tensor-operations-and-memory", "caching-allocator.md")
    assert "Unrecognized key 'expandable_segment' in CUDA allocator config." in text


def test_the_profiling_skill_no_longer_says_multiples_of_8_switch_tensor_cores_on():
    """Alignment is an efficiency matter on current cuBLAS (citation above)."""
    assert "so\n  tensor cores engage" not in (SKILLS / "performance-profiling" / "SKILL.md").read_text()


def test_no_skill_block_writes_through_dot_data():
    """Blocks change parameters under torch.no_grad(), never through .data (autograd cannot see it)."""
    offenders = [
        b.where
        for b in python_blocks([SKILLS])
        for line in b.code.splitlines()
        if re.search(r"\w\.data\.\w+_\(", line)
    ]
    assert not offenders, offenders


def test_gradcheck_runs_two_forwards_per_input_element():
    """Central differences: f(x + eps) and f(x - eps) for each element, plus the analytical pass."""
    calls = [0]

    def f(x):
        calls[0] += 1
        return x.sin()

    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (x,))
    assert calls[0] >= 2 * x.numel()
    assert "two forwards per input element" in _ref("custom-autograd-functions", "testing-gradients.md")


# -- issue 27: new material (data pipelines, GPU visibility, ONNX, LoRA) ---------------------------
class _Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int, shard: bool):
        self.n, self.shard = n, shard

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if not self.shard or info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


@pytest.mark.parametrize(("shard", "copies"), [(False, 2), (True, 1)])
def test_an_iterable_dataset_yields_every_sample_once_per_worker_unless_sharded(shard: bool, copies: int):
    """Two workers without get_worker_info sharding: each sample twice; sharded: once."""
    loader = torch.utils.data.DataLoader(_Stream(6, shard), batch_size=3, num_workers=2)
    assert sorted(int(x) for b in loader for x in b) == sorted(list(range(6)) * copies)
    text = _ref("performance-profiling", "data-pipeline-correctness.md")
    assert "get_worker_info" in text and "/dev/shm" in text and "collate_fn" in text


@_CPU_WHEEL
def test_a_cpu_wheel_has_no_cuda_version_no_architectures_and_no_gpu():
    """What the GPU-visibility reference tells the reader to look for on a CPU wheel."""
    assert torch.version.cuda is None and torch.version.hip is None
    assert not torch.cuda.is_available() and not torch.backends.cuda.is_built()
    assert torch.cuda.get_arch_list() == []
    assert "`torch.version.cuda` is `None`" in (SKILLS / "debugging-techniques" / "SKILL.md").read_text()


def test_the_wheel_table_matches_the_architectures_this_torch_release_lists():
    """gpu-not-visible.md's table of compute capabilities is PYTORCH_RELEASES_CODE_CC for x86-64."""
    from torch.cuda import PYTORCH_RELEASES_CODE_CC

    text = _ref("debugging-techniques", "gpu-not-visible.md")
    rows = re.findall(r"^\| (`cu126`|CUDA 12\.9 and 13\.x[^|]*) \| ([\d., ]+) \|", text, re.M)
    listed = {label.split()[0]: {round(float(c) * 10) for c in caps.split(",")} for label, caps in rows}
    x86 = {cuda: ccs["x86_64"] for cuda, ccs in PYTORCH_RELEASES_CODE_CC.items()}
    assert listed["`cu126`"] == x86["12.6"]
    newer = [v for v in x86 if v != "12.6"]  # 12.9, 13.0, 13.2 in 2.13; 13.0, 13.2, 13.4 in 2.14 and 2.15
    assert newer and all(listed["CUDA"] == x86[v] for v in newer)
    assert 61 not in listed["CUDA"] and 120 not in listed["`cu126`"]  # Pascal only cu126; sm_120 never
    for variant in newer:  # every variant this release lists is named in the table row
        assert f"`cu{variant.replace('.', '')}`" in text, variant


def test_onnx_export_defaults_to_the_dynamo_exporter_at_opset_20():
    """torch.onnx.export(dynamo=True) is the default, dynamo_export is gone, the opset is as stated."""
    from torch.onnx import _constants

    assert inspect.signature(torch.onnx.export).parameters["dynamo"].default is True
    assert not hasattr(torch.onnx, "dynamo_export")
    text = _ref("performance-profiling", "export-and-inference.md")
    assert f"The default opset is {_constants.ONNX_DEFAULT_OPSET} in 2.13 through 2.15" in text


def test_reentrant_checkpoint_leaves_adapters_behind_a_frozen_input_without_gradients():
    """The LoRA trap the OOM playbook warns about: use_reentrant=True, frozen input -> no grads."""
    import warnings

    from torch.utils.checkpoint import checkpoint

    adapter = torch.nn.Linear(4, 4)
    frozen_embedding_output = torch.randn(2, 4)  # requires_grad=False, as below a frozen embedding
    for reentrant, expect_grad in ((True, False), (False, True)):
        adapter.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "None of the inputs have requires_grad=True"
            out = checkpoint(adapter, frozen_embedding_output, use_reentrant=reentrant)
        if out.requires_grad:
            out.sum().backward()
        assert (adapter.weight.grad is not None) is expect_grad
    assert "keep `use_reentrant=False`" in _ref("tensor-operations-and-memory", "oom-playbook.md")


# == torch 2.14 / 2.15 ============================================================================
def test_selective_checkpointing_keeps_its_saved_tensors_away_from_saved_tensors_hooks():
    """SAC-saved tensors bypass save_on_cpu-style hooks; from 2.14 respect_saved_tensors_hooks=True routes them."""
    import functools
    import warnings

    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    block = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    x = torch.randn(2, 4, requires_grad=True)
    save_matmuls = functools.partial(create_selective_checkpoint_contexts, [torch.ops.aten.addmm.default])
    routed = "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters  # 2.14 and later
    for respect in (None, True) if routed else (None,):
        packed: list[torch.Size] = []
        extra = {} if respect is None else {"respect_saved_tensors_hooks": respect}

        def pack(t: torch.Tensor, into: list[torch.Size] = packed) -> torch.Tensor:
            into.append(t.shape)
            return t

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = checkpoint(block, x, use_reentrant=False, context_fn=save_matmuls, **extra)
        assert packed == [x.shape] if respect is None else len(packed) > 1  # only the checkpoint's input
        future = [w for w in caught if issubclass(w.category, FutureWarning)]
        assert bool(future) == (routed and respect is None)
        out.sum().backward()
    text = _ref("tensor-operations-and-memory", "oom-playbook.md")
    assert "respect_saved_tensors_hooks=True" in text and "From torch 2.14" in text
