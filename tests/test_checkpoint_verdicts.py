"""The four verdicts over MCP: safe, safe with an allowlist (and its recipe), unsafe, corrupt; per-file in folders."""

from __future__ import annotations

import pytest

from tests.checkpoint_support import MODELS, shared_corpus

BUILD = f"{MODELS}:build"


@pytest.fixture(scope="session")
def corpus():
    return shared_corpus()


def sample(corpus, name: str):
    return next(s for s in corpus.samples if s.name == name)


async def verify(client, **arguments) -> dict:
    r = await client.call_tool("verify_checkpoint", arguments)
    assert not r.is_error, r.content
    return r.structured_content


async def test_a_timm_checkpoint_with_namespace_args_is_safe_with_an_allowlist_and_analysed(client, corpus):
    """argparse.Namespace makes it safe_with_allowlist; the recipe names it; tensors, resume and fit are still done."""
    path = sample(corpus, "timm_train_checkpoint").path
    r = await verify(client, path=str(path), model=BUILD)
    assert r["safe"] and r["verdict"] == "safe_with_allowlist" and r["loaded"] and r["load_error"] is None
    assert r["needs_safe_globals"] == ["argparse.Namespace"]
    assert "safe_globals" in r["allowlist_recipe"] and "argparse.Namespace" in r["allowlist_recipe"]
    assert r["tensors"]["count"] > 0 and r["resume"]["kind"] == "training" and r["key_mismatch"]["fits"]
    assert r["summary"].startswith("Safe to load with an allowlist")


def test_the_allowlist_recipe_loads_the_file_with_weights_only(corpus):
    """The recipe text, run as written, loads the timm checkpoint with weights_only=True."""
    from torch_skills.checkpoint.scan import scan_path
    from torch_skills.checkpoint.verdict import allowlist_recipe, needs_safe_globals

    path = sample(corpus, "timm_train_checkpoint").path
    [file] = scan_path(path).files
    recipe = allowlist_recipe(needs_safe_globals(file), str(path))
    namespace: dict = {}
    exec(recipe, namespace)  # our own benign test file, loaded with weights_only=True
    assert namespace["checkpoint"]["args"].model == "resnet50"


@pytest.mark.parametrize(
    ("name", "needs"),
    [
        ("lightning_namespace_hparams", {"argparse.Namespace"}),
        ("stdlib_data_types", {"datetime.datetime", "datetime.timedelta", "pathlib.PurePosixPath"}),
        ("stdlib_containers_pickle", {"collections.defaultdict", "collections.deque", "builtins.list"}),
        ("numpy_inside", None),
    ],
)
async def test_plain_data_classes_are_no_longer_false_alarms(client, corpus, name, needs):
    """Lightning Namespace hparams, datetime/paths, defaultdict/deque and numpy load through an allowlist."""
    r = await verify(client, path=str(sample(corpus, name).path))
    assert r["verdict"] == "safe_with_allowlist" and r["loaded"] and r["unsafe_global_count"] == 0, r[
        "summary"
    ]
    if needs is not None:
        assert needs <= set(r["needs_safe_globals"])


async def test_a_trainer_folder_with_training_args_keeps_every_file_usable(client, corpus):
    """training_args.bin (TrainingArguments) needs the allowlist; model, optimizer, scheduler and RNG are analysed."""
    try:
        s = sample(corpus, "huggingface_trainer_with_training_args")
    except StopIteration:
        pytest.skip("transformers/accelerate not installed: no TrainingArguments sample")
    r = await verify(client, path=str(s.path))
    assert r["verdict"] == "safe_with_allowlist" and r["layout"] == "huggingface_trainer"
    verdicts = {f["name"]: f["verdict"] for f in r["files"]}
    assert verdicts["training_args.bin"] == "safe_with_allowlist"
    assert verdicts["model.safetensors"] == verdicts["optimizer.pt"] == verdicts["scheduler.pt"] == "safe"
    assert "transformers.training_args.TrainingArguments" in r["needs_safe_globals"]
    assert {x["role"] for x in r["resume"]["roles"]} >= {"model", "optimizer", "scheduler"}


async def test_an_unsafe_folder_names_the_files_that_stay_usable(client, corpus):
    """A payload in training_args.bin makes the folder unsafe, and the weights file keeps its own safe verdict."""
    r = await verify(client, path=str(sample(corpus, "hf_training_args").path))
    assert r["verdict"] == "unsafe" and not r["loaded"]
    verdicts = {f["name"]: f["verdict"] for f in r["files"]}
    assert verdicts["training_args.bin"] == "unsafe" and verdicts["model.safetensors"] == "safe"
    assert "usable_files" in {f["code"] for f in r["findings"]} and "1 of 2 files are safe" in r["summary"]


async def test_a_truncated_file_is_corrupt_not_unsafe(client, corpus):
    """Nothing hostile, bytes unreadable: the verdict is corrupt and the summary says so."""
    from tests.checkpoint_support import scratch_dir

    folder = scratch_dir("corrupt")
    path = folder / "cut.pkl"
    path.write_bytes(sample(corpus, "plain_pickle_protocol0").path.read_bytes()[:-10])
    r = await verify(client, path=str(path))
    assert r["verdict"] == "corrupt" and not r["safe"] and r["summary"].startswith("CORRUPT")


@pytest.mark.parametrize(
    "name", ["plain_state_dict", "dcp", "safetensors", "numpy_npy", "numpy_npz", "pt2_archive"]
)
async def test_files_torch_loads_as_they_are_are_plain_safe(client, corpus, name):
    """No allowlist recipe where none is needed (DCP metadata classes are read with stand-ins, not torch.load)."""
    r = await verify(client, path=str(sample(corpus, name).path))
    assert r["verdict"] == "safe" and r["allowlist_recipe"] is None and r["loaded"], r["summary"]
