"""verify_checkpoint end to end over MCP: completeness, fit to a model, load_and_run, errors."""

from __future__ import annotations

import pytest

from tests.checkpoint_support import MODELS, scratch_dir, shared_corpus

BUILD = f"{MODELS}:build"
BUILD_WIDE = f"{MODELS}:build_wide"
INPUTS = f"{MODELS}:make_inputs"
SKILL = "checkpointing-and-reproducibility"


@pytest.fixture(scope="session")
def corpus():
    return shared_corpus()


def benign(corpus, name: str) -> str:
    return str(next(s.path for s in corpus.benign if s.name == name))


def malicious(corpus, name: str):
    return next(s for s in corpus.malicious if s.name == name)


async def verify(client, **arguments) -> dict:
    r = await client.call_tool("verify_checkpoint", arguments)
    assert not r.is_error, r.content
    return r.structured_content


def codes(result: dict) -> set[str]:
    return {f["code"] for f in result["findings"]}


async def test_a_full_training_checkpoint_is_complete_consistent_and_fits(client, corpus):
    """Every resume piece is found under its key, the optimizer matches the model, keys fit as is."""
    result = await verify(client, path=benign(corpus, "full_training_checkpoint"), model=BUILD)
    assert result["safe"] and result["format"] == "torch_zip" and result["layout"] == "training_checkpoint"
    assert result["missing_for_resume"] == []
    roles = {r["role"]: r["key"] for r in result["resume"]["roles"]}
    assert roles["optimizer"] == "optimizer_state_dict" and roles["rng_numpy"] == "rng_state.numpy"
    [opt] = result["optimizers"]
    assert opt["consistent"] and opt["model_parameters"] == 6 == opt["params_in_groups"]
    assert result["key_mismatch"]["fits"] and result["key_mismatch"]["prefix_fix"] is None
    assert result["needs_safe_globals"]  # numpy's RNG state inside
    assert result["loaded_with"] == "torch.load(weights_only=True, mmap=True)"


async def test_a_ddp_checkpoint_loads_strictly_after_the_detected_prefix_fix(client, corpus):
    """module. is detected, applied, and the model loads with strict=True and runs a forward."""
    result = await verify(
        client, path=benign(corpus, "ddp_prefix"), model=BUILD, load_and_run=True, input_shape=[4, 8]
    )
    fix = result["key_mismatch"]["prefix_fix"]
    assert "module." in fix["description"] and "consume_prefix_in_state_dict_if_present" in fix["code"]
    assert result["key_mismatch"]["matched_as_is"] == 0 and result["key_mismatch"]["fits"]
    run = result["load_and_run"]
    assert run["loaded"] and run["forward_ran"] and run["prefix_fix_applied"]
    assert run["output_shapes"] == [[4, 4]] and run["output_finite"] is True
    assert "key_prefix_mismatch" in codes(result)


async def test_a_wider_model_does_not_fit_and_strict_loading_fails(client, corpus):
    """Shape mismatches are listed and load_and_run reports load_state_dict's error."""
    result = await verify(
        client, path=benign(corpus, "plain_state_dict"), model=BUILD_WIDE, load_and_run=True, inputs=INPUTS
    )
    mismatch = result["key_mismatch"]
    assert not mismatch["fits"] and mismatch["missing_count"] == 0
    first = next(m for m in mismatch["shape_mismatches"] if m["key"] == "fc1.weight")
    assert first["checkpoint_shape"] == [16, 8] and first["model_shape"] == [32, 8]
    assert not result["load_and_run"]["loaded"] and "size mismatch" in result["load_and_run"]["error"]
    assert {"shape_mismatch", "load_and_run_failed"} <= codes(result)


async def test_optimizer_state_for_another_width_is_inconsistent_with_the_model(client, corpus):
    """The optimizer's moment tensors do not fit the wider model's parameters."""
    result = await verify(client, path=benign(corpus, "full_training_checkpoint"), model=BUILD_WIDE)
    [opt] = result["optimizers"]
    assert not opt["consistent"] and opt["shape_mismatches"]
    assert "optimizer_inconsistent" in codes(result)


async def test_nan_and_inf_weights_are_named_with_counts(client, corpus):
    """The safe file with NaN/Inf reports the exact tensors and counts."""
    result = await verify(client, path=benign(corpus, "nan_weights"))
    found = {t["name"]: (t["nan"], t["inf"]) for t in result["nonfinite_tensors"]}
    assert found == {"fc1.weight": (3, 0), "fc2.bias": (0, 1)}
    finding = next(f for f in result["findings"] if f["code"] == "nonfinite_tensors")
    assert finding["severity"] == "error" and finding["skill"] == "debugging-techniques"


async def test_a_lightning_checkpoint_needs_its_model_prefix_stripped(client, corpus):
    """Lightning layout, 'model.' prefix fix, and the pieces Lightning does not save are missing."""
    result = await verify(client, path=benign(corpus, "lightning_ckpt"), model=BUILD)
    assert result["layout"] == "lightning"
    assert result["key_mismatch"]["prefix_fix"]["strip_prefix"] == "model." and result["key_mismatch"]["fits"]
    assert {"grad_scaler", "rng_torch"} <= set(result["missing_for_resume"])


async def test_a_dcp_folder_fits_the_model_and_runs(client, corpus):
    """DCP tensors are compared from metadata, then assembled from their items for load_and_run."""
    result = await verify(
        client, path=benign(corpus, "dcp"), model=BUILD, load_and_run=True, input_shape=[2, 8]
    )
    assert result["format"] == "dcp" and result["layout"] == "dcp"
    assert result["key_mismatch"]["fits"] and result["load_and_run"]["forward_ran"]
    assert {"model", "optimizer", "epoch_or_step"} <= {r["role"] for r in result["resume"]["roles"]}


async def test_sharded_safetensors_load_and_run_reads_tensors_by_offset(client, corpus):
    """The index's shards are merged into one state dict that loads strictly."""
    result = await verify(
        client, path=benign(corpus, "sharded_safetensors"), model=BUILD, load_and_run=True, input_shape=[2, 8]
    )
    assert result["format"] == "safetensors_sharded" and len(result["files"]) == 3
    assert result["key_mismatch"]["fits"] and result["load_and_run"]["loaded"]


async def test_a_hugging_face_trainer_folder_maps_its_files_to_resume_pieces(client, corpus):
    """optimizer.pt, scheduler.pt, scaler.pt, rng_state.pth and trainer_state.json are recognised."""
    result = await verify(client, path=benign(corpus, "huggingface_trainer"), model=BUILD)
    assert result["format"] == "huggingface" and result["layout"] == "huggingface_trainer"
    roles = {r["role"]: (r["key"], r["matched_by"]) for r in result["resume"]["roles"]}
    assert (
        roles["optimizer"] == ("optimizer.pt", "file")
        and roles["epoch_or_step"][0] == "trainer_state.json:global_step"
    )
    assert result["missing_for_resume"] == ["sampler"]
    assert result["key_mismatch"]["compared"] == "model.safetensors" and result["key_mismatch"]["fits"]


async def test_a_legacy_file_loads_without_mmap_and_says_so(client, corpus):
    """The pre-1.6 format is loaded with weights_only and flagged as not memory-mappable."""
    result = await verify(client, path=benign(corpus, "legacy_format"))
    assert result["format"] == "torch_legacy" and "legacy" in result["loaded_with"]
    assert "legacy_format" in codes(result)


async def test_numpy_globals_become_unsafe_when_numpy_is_not_allowed(client, corpus):
    """allow_numpy=False applies weights_only's default exactly: numpy arrays are refused."""
    result = await verify(client, path=benign(corpus, "numpy_inside"), allow_numpy=False)
    assert not result["safe"] and not result["loaded"]
    assert {u["qualified"] for u in result["unsafe_globals"]} >= {"numpy.ndarray", "numpy.dtype"}
    assert all(u["risk"] == "unknown" for u in result["unsafe_globals"])


async def test_an_unsafe_file_is_never_loaded_even_when_load_and_run_is_asked(client, corpus):
    """The payload is named, load_and_run is not attempted, and the sentinel stays absent."""
    sample = malicious(corpus, "torch_zip_payload")
    result = await verify(client, path=str(sample.path), model=BUILD, load_and_run=True, input_shape=[2, 8])
    assert not result["safe"] and result["layout"] == "not_loaded"
    assert "not attempted" in result["load_and_run"]["error"]
    finding = next(f for f in result["findings"] if f["code"] == "unsafe_global")
    assert "posix.system" in finding["message"] and finding["skill"] == SKILL
    assert result["summary"].startswith("UNSAFE") and not sample.executed()


async def test_a_truncated_checkpoint_is_a_clear_finding_not_a_crash(client, corpus):
    """Half a torch.save archive comes back as corrupt_zip with safe=false."""
    folder = scratch_dir("truncated")
    source = corpus.benign[0].path.read_bytes()
    path = folder / "half.pt"
    path.write_bytes(source[: len(source) // 2])
    result = await verify(client, path=str(path))
    assert not result["safe"] and "corrupt_zip" in {p["code"] for p in result["problems"]}


async def test_a_missing_checkpoint_is_a_tool_error_naming_what_is_there(client, corpus):
    """A wrong file name inside an allowed root lists the folder's files."""
    r = await client.call_tool("verify_checkpoint", {"path": str(corpus.root / "benign" / "nope.pt")})
    assert r.is_error and "no checkpoint at" in r.content[0].text and "state_dict.pt" in r.content[0].text


async def test_a_path_outside_the_allowed_roots_is_refused_before_any_read(client):
    """The server checks the path against its roots before the worker starts."""
    r = await client.call_tool("verify_checkpoint", {"path": "/etc/passwd"})
    assert r.is_error and "outside the allowed roots" in r.content[0].text


async def test_load_and_run_without_inputs_is_rejected_with_the_next_step(client, corpus):
    """Asking for a forward with nothing to feed it says which argument to add."""
    r = await client.call_tool(
        "verify_checkpoint",
        {"path": benign(corpus, "plain_state_dict"), "model": BUILD, "load_and_run": True},
    )
    assert r.is_error and "input_shape" in r.content[0].text


@pytest.mark.gpu
async def test_load_and_run_can_run_the_forward_on_cuda(client, corpus):
    """With device='cuda' the checked weights are loaded on CPU, then the model runs on the GPU."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    result = await verify(
        client,
        path=benign(corpus, "ddp_prefix"),
        model=BUILD,
        load_and_run=True,
        input_shape=[2, 8],
        device="cuda",
    )
    assert result["load_and_run"]["forward_ran"] and result["run"]["device"].startswith("cuda")
