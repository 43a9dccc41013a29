"""Contents of a loaded checkpoint: tensors and NaN/Inf, resume completeness, optimizer consistency, key fit."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.checkpoint_corpus import trained_net, training_checkpoint, write_safetensors
from tests.fixtures.checkpoint_models import TinyNet
from torch_skills.checkpoint.contents import find_nonfinite, summarize_tensors
from torch_skills.checkpoint.fit import compare_state_dicts
from torch_skills.checkpoint.load import load_checkpoint
from torch_skills.checkpoint.resume import RESUME_ROLES, find_resume_roles, optimizer_checks
from torch_skills.checkpoint.scan import scan_path


def entries(state: dict) -> dict:
    return {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()}


def test_a_complete_training_checkpoint_misses_nothing():
    """Model, optimizer, scheduler, scaler, counters, four RNG states and the sampler are all found."""
    check = find_resume_roles(training_checkpoint())
    assert check.kind == "training" and check.missing == []
    taken = {r.role: r.key for r in check.roles}
    assert taken["model"] == "model_state_dict" and taken["optimizer"] == "optimizer_state_dict"
    assert taken["rng_torch"] == "rng_state.torch" and taken["rng_cuda"] == "rng_state.cuda"
    assert set(taken) == set(RESUME_ROLES)


@pytest.mark.parametrize(
    ("dropped", "role"),
    [
        ("model_state_dict", "model"),
        ("optimizer_state_dict", "optimizer"),
        ("lr_scheduler", "scheduler"),
        ("scaler", "grad_scaler"),
        ("epoch", "epoch_or_step"),
        ("rng.torch", "rng_torch"),
        ("rng.cuda", "rng_cuda"),
        ("rng.numpy", "rng_numpy"),
        ("rng.python", "rng_python"),
        ("sampler_state", "sampler"),
    ],
)
def test_removing_one_piece_reports_exactly_that_piece_missing(dropped, role):
    """Each resume piece, when absent, is the one (and only one) reported."""
    assert find_resume_roles(training_checkpoint(drop=(dropped,))).missing == [role]


@pytest.mark.parametrize("key", ["model", "model_state_dict", "state_dict", "net", "network"])
def test_common_model_key_names_are_recognised(key):
    """Whatever the convention, the weights are found and the key is reported."""
    check = find_resume_roles({key: TinyNet().state_dict(), "epoch": 1})
    assert next(r for r in check.roles if r.role == "model").key == key


def test_pieces_under_unfamiliar_keys_are_found_by_their_structure():
    """A state dict and an optimizer state under odd names are still recognised, by shape."""
    net, opt, sched = trained_net()
    check = find_resume_roles(
        {"weights_v2": net.state_dict(), "opt_blob": opt.state_dict(), "sched_x": sched.state_dict()}
    )
    found = {r.role: (r.key, r.matched_by) for r in check.roles}
    assert found["model"] == ("weights_v2", "structure")
    assert found["optimizer"] == ("opt_blob", "structure") and found["scheduler"] == ("sched_x", "structure")


def test_a_bare_state_dict_is_weights_only():
    """A flat {name: tensor} file is the model itself, with nothing to resume from."""
    check = find_resume_roles(TinyNet().state_dict())
    assert check.kind == "weights_only" and check.roles[0].key == "(the whole file)"
    assert "optimizer" in check.missing


def model_params(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def test_an_optimizer_built_for_the_model_is_consistent():
    """Group sizes, state entries and state shapes all match the model's parameters."""
    ckpt = training_checkpoint()
    [check] = optimizer_checks(ckpt, find_resume_roles(ckpt), model_params(TinyNet()))
    assert check.consistent and check.params_in_groups == 6 and check.state_entries == 6


def test_an_optimizer_for_a_different_width_has_shape_mismatches():
    """Same parameter count, different shapes: each mismatch names the model parameter."""
    ckpt = training_checkpoint()
    [check] = optimizer_checks(ckpt, find_resume_roles(ckpt), model_params(TinyNet(hidden=32)))
    assert not check.consistent
    assert {m.parameter for m in check.shape_mismatches} >= {"fc1.weight", "fc2.weight"}
    first = next(m for m in check.shape_mismatches if m.parameter == "fc1.weight")
    assert first.state_shape == [16, 8] and first.parameter_shape == [32, 8]


def test_an_optimizer_holding_more_params_than_the_model_is_inconsistent():
    """Six optimizer entries against a two-parameter model is a count mismatch."""
    ckpt = training_checkpoint()
    [check] = optimizer_checks(ckpt, find_resume_roles(ckpt), model_params(torch.nn.Linear(8, 4)))
    assert not check.consistent and check.model_parameters == 2 and "holds 6 parameters" in check.problems[0]


def test_duplicate_params_and_orphan_state_are_reported():
    """A parameter in two groups and a state entry in none are both named."""
    _, opt, _ = trained_net()
    state = opt.state_dict()
    state["param_groups"].append({**state["param_groups"][0], "params": [0]})
    state["state"][99] = {"step": torch.tensor(1.0)}
    ckpt = {"optimizer": state, "model": TinyNet().state_dict()}
    [check] = optimizer_checks(ckpt, find_resume_roles(ckpt), None)
    assert check.duplicate_params == 1 and check.state_not_in_groups == 1 and not check.consistent


@pytest.mark.parametrize(
    ("rename", "fix_text"),
    [
        (lambda k: f"module.{k}", "remove 'module.'"),
        (lambda k: f"_orig_mod.{k}", "remove '_orig_mod.'"),
        (lambda k: f"module._orig_mod.{k}", "remove '_orig_mod.'"),
        (
            lambda k: k.replace("fc1.", "fc1._fsdp_wrapped_module._checkpoint_wrapped_module."),
            "at every depth",
        ),
        (lambda k: f"model.{k}", "strip the 'model.' prefix"),
    ],
)
def test_wrapper_prefixes_are_detected_and_the_generated_code_fixes_them(rename, fix_text):
    """The reported rename makes every key match, and its code snippet really loads strictly."""
    source = TinyNet().state_dict()
    ckpt = {rename(k): v for k, v in source.items()}
    report = compare_state_dicts(entries(ckpt), entries(TinyNet().state_dict()))
    assert report.fits and fix_text in report.fix.describe()
    namespace = {"state_dict": dict(ckpt)}
    exec(report.fix.code(), namespace)
    TinyNet().load_state_dict(namespace["state_dict"], strict=True)


def test_a_checkpoint_missing_a_prefix_the_model_has_gets_one_added():
    """Keys saved from the inner module fit a wrapped model after adding 'module.'."""
    wrapped = torch.nn.DataParallel(TinyNet())
    report = compare_state_dicts(entries(TinyNet().state_dict()), entries(wrapped.state_dict()))
    assert report.fits and report.fix.add_prefix == "module."


def test_a_wider_model_reports_shape_mismatches_not_missing_keys():
    """Every key matches by name; the hidden-size tensors differ in shape."""
    report = compare_state_dicts(entries(TinyNet().state_dict()), entries(TinyNet(hidden=32).state_dict()))
    assert not report.fits and not report.missing and not report.unexpected
    assert {m.key for m in report.shape_mismatches} >= {"fc1.weight", "norm.running_mean", "fc2.weight"}


def test_missing_unexpected_and_dtype_differences_are_listed():
    """A dropped key, an extra key and a half-precision tensor are each reported where they belong."""
    ckpt = TinyNet().state_dict()
    del ckpt["fc2.bias"]
    ckpt["head.weight"] = torch.zeros(2)
    ckpt["fc1.weight"] = ckpt["fc1.weight"].half()
    report = compare_state_dicts(entries(ckpt), entries(TinyNet().state_dict()))
    assert report.missing == ["fc2.bias"] and report.unexpected == ["head.weight"]
    assert [m.key for m in report.dtype_mismatches] == ["fc1.weight"]


def test_tensor_totals_are_numel_times_element_size():
    """total_bytes is the sum of numel * element_size; dtypes are counted."""
    state = {
        "a": torch.zeros(3, 4),
        "b": torch.zeros(5, dtype=torch.float16),
        "c": torch.zeros(2, dtype=torch.int64),
    }
    summary = summarize_tensors(state)
    assert summary.count == 3 and summary.total_bytes == 3 * 4 * 4 + 5 * 2 + 2 * 8
    assert {d.dtype: d.count for d in summary.dtypes} == {"float32": 1, "float16": 1, "int64": 1}


def test_nan_and_inf_are_counted_exactly_across_chunk_boundaries():
    """Counts do not depend on the chunk size; integer tensors are skipped."""
    t = torch.zeros(10_001)
    t[[0, 4_999, 5_000, 10_000]] = float("nan")
    t[[7, 9_999]] = float("inf")
    t[8] = -float("inf")
    state = {"w": t, "ids": torch.arange(5), "ok": torch.ones(3)}
    for chunk in (7, 1000, 1 << 22):
        [found] = find_nonfinite(state, chunk_elements=chunk)
        assert (found.name, found.nan, found.inf, found.numel) == ("w", 4, 3, 10_001)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.complex64, torch.float8_e4m3fn])
def test_low_precision_and_complex_tensors_are_scanned(dtype):
    """bf16/fp16, complex (both parts) and float8 (upcast per chunk) are all checked."""
    t = torch.ones(6, dtype=torch.float32)
    t[2] = float("nan")
    t = t.to(dtype)
    [found] = find_nonfinite({"t": t})
    assert found.nan >= 1


def test_a_non_contiguous_tensor_is_scanned_slice_by_slice():
    """A transposed view is read row by row without a full contiguous copy."""
    t = torch.zeros(4, 6)
    t[1, 5] = float("inf")
    [found] = find_nonfinite({"t": t.t()}, chunk_elements=3)
    assert found.inf == 1 and found.shape == [6, 4]


def test_memory_mapped_tensors_keep_their_values_after_pages_are_released(tmp_path):
    """madvise(DONTNEED) on the read-only file mapping drops pages, never data."""
    state = {"w": torch.randn(300_000), "v": torch.randn(1000)}
    state["v"][3] = float("nan")
    path = tmp_path / "big.pt"
    torch.save(state, path)
    loaded = load_checkpoint(scan_path(path))
    [found] = find_nonfinite(loaded.obj, mapped_file=loaded.mapped_file, chunk_elements=4096)
    assert found.name == "v" and found.nan == 1
    assert torch.equal(loaded.obj["w"], state["w"])


def test_safetensors_tensors_are_streamed_from_the_file(tmp_path):
    """NaN counts come from the bytes at each tensor's offsets, in chunks."""
    w = torch.ones(1000, dtype=torch.bfloat16)
    w[10:13] = float("nan")
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"a": torch.zeros(3), "w": w})
    loaded = load_checkpoint(scan_path(path))
    [found] = find_nonfinite(loaded.obj, chunk_elements=64)
    assert (found.name, found.dtype, found.nan) == ("w", "bfloat16", 3)
    torch.testing.assert_close(loaded.obj["w"].read(), w, rtol=0, atol=0, equal_nan=True)


def test_many_small_tensors_are_checked_in_runs_with_exact_counts(tmp_path):
    """Runs of small safetensors tensors are read at once; a NaN/Inf inside is still counted per tensor."""
    tensors = {}
    for i in range(300):
        tensors[f"f{i:03d}"] = torch.full((3,), float(i))
        tensors[f"i{i:03d}"] = torch.tensor([-1, 0x7FC00000], dtype=torch.int32)  # NaN bit patterns as ints
    tensors["f150"][1] = float("nan")
    tensors["f151"][:] = float("inf")
    path = tmp_path / "many.safetensors"
    write_safetensors(path, tensors)
    found = find_nonfinite(load_checkpoint(scan_path(path)).obj)
    assert sorted((f.name, f.nan, f.inf) for f in found) == [("f150", 1, 0), ("f151", 0, 3)]


def test_sparse_and_meta_tensors_are_counted_but_not_read(tmp_path):
    """Tensors without dense storage load safely and are skipped by the NaN scan."""
    path = tmp_path / "odd.pt"
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0, 2]]), torch.tensor([float("nan"), 1.0]), (4,), check_invariants=True
    )
    torch.save({"sparse": sparse, "meta": torch.empty(3, device="meta"), "dense": torch.ones(2)}, path)
    loaded = load_checkpoint(scan_path(path))
    assert summarize_tensors(loaded.obj).count == 3
    assert find_nonfinite(loaded.obj, mapped_file=loaded.mapped_file) == []
