"""Key fitting follows the loaders' own rules: tied keys and the library's renames are not mismatches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from torch_skills.checkpoint.fit import LibraryRename, compare_state_dicts
from torch_skills.checkpoint.modelkeys import model_keys
from torch_skills.checkpoint.models import VerifyCheckpointRequest
from torch_skills.checkpoint.worker import run
from torch_skills.runner.child import JobContext

E = ((4, 4), "float32")


class TiedLM(nn.Module):
    """nanoGPT's weight tying: the output head is the token embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(32, 8)
        self.lm_head = nn.Linear(8, 32, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.wte(idx))


def tied_lm() -> nn.Module:
    return TiedLM()


def tokens(batch_size: int = 2) -> torch.Tensor:
    return torch.randint(0, 32, (batch_size, 5))


def test_model_keys_finds_tied_storage():
    """lm_head.weight is recorded as tied to wte.weight; untied keys are not."""
    keys = model_keys(TiedLM())
    assert keys.tied == {"lm_head.weight": "wte.weight"} and keys.library is None


def test_a_missing_tied_key_is_not_missing_when_its_partner_is_present():
    """The checkpoint holds one key of the tied pair: the fit holds, the other is listed as tied_missing."""
    report = compare_state_dicts(
        {"wte.weight": E}, {"wte.weight": E, "lm_head.weight": E}, tied={"lm_head.weight": "wte.weight"}
    )
    assert report.fits and report.missing == [] and report.tied_missing == ["lm_head.weight"]


def test_a_tied_group_with_no_member_in_the_checkpoint_is_missing():
    """Both keys of a tied pair absent: that is really missing."""
    report = compare_state_dicts(
        {"other": E},
        {"wte.weight": E, "lm_head.weight": E, "other": E},
        tied={"lm_head.weight": "wte.weight"},
    )
    assert not report.fits and set(report.missing) == {"wte.weight", "lm_head.weight"}


def test_the_library_rename_is_applied_before_wrapper_renames():
    """A loader's own rename (gamma -> weight here) maps the keys; a DDP prefix on top is still found."""
    rename = LibraryRename("test loader", lambda k: k.replace(".gamma", ".weight"))
    ckpt = {"module.norm.gamma": E, "module.fc.weight": E}
    report = compare_state_dicts(ckpt, {"norm.weight": E, "fc.weight": E}, library=rename)
    assert report.fits and report.library == "test loader" and report.library_renamed == 1
    assert report.fix.remove_components == ("module",)
    assert report.fix.apply("module.norm.gamma") == "norm.weight"


@pytest.fixture
def job(tmp_path: Path) -> JobContext:
    return JobContext(tmp_path, "cpu", [str(tmp_path), str(Path(__file__).parent)], str(tmp_path))


def test_a_tied_checkpoint_without_the_duplicate_fits_loads_and_runs(job, tmp_path: Path):
    """verify_checkpoint on a state dict saved without lm_head.weight: fits, loads (tied keys excepted), runs."""
    state = {k: v for k, v in TiedLM().state_dict().items() if k != "lm_head.weight"}
    torch.save(state, tmp_path / "tied.pt")
    here = Path(__file__)
    result = run(
        VerifyCheckpointRequest(
            path=str(tmp_path / "tied.pt"),
            model=f"{here}:tied_lm",
            inputs=f"{here}:tokens",
            load_and_run=True,
        ),
        job,
    )
    assert result.key_mismatch.fits and result.key_mismatch.tied_missing == ["lm_head.weight"]
    assert result.load_and_run.loaded and result.load_and_run.forward_ran, result.load_and_run.error
    assert not [f for f in result.findings if f.severity != "info"], result.findings


def _hf_prefix_rename(prefix: str, model_keys_: set[str]) -> LibraryRename:
    """from_pretrained's base_model_prefix rule, as modelkeys._prefix_only writes it."""
    from torch_skills.checkpoint.modelkeys import _prefix_only

    return _prefix_only(prefix, {k: E for k in model_keys_})


def test_a_fit_through_from_pretrained_s_prefix_rule_is_not_claimed_for_load_state_dict():
    """Keys saved without 'model.': from_pretrained fits as is, load_state_dict only with the written-out prefix rule."""
    from torch_skills.checkpoint.loaders import HFClass, loader_calls

    model = {"model.embed.weight": E, "model.norm.weight": E, "lm_head.weight": E}
    ckpt = {"embed.weight": E, "norm.weight": E, "lm_head.weight": E}
    library = _hf_prefix_rename("model", set(model))
    with_library = compare_state_dicts(ckpt, model, library=library)
    plain = compare_state_dicts(ckpt, model)
    renames = {k: library.rename(k) for k in ckpt}
    calls = loader_calls(
        with_library,
        plain,
        library_keys=renames,
        hf=HFClass("Qwen2ForCausalLM", "transformers", "model"),
        folder=None,
    )
    by = {c.loader: c for c in calls}
    assert (
        by["from_pretrained"].fits_as_is
        and not by["load_state_dict"].fits_as_is
        and by["load_state_dict"].fits
    )
    assert (
        "Qwen2ForCausalLM.from_pretrained(None, config=model.config, state_dict=state_dict)"
        in by["from_pretrained"].call
    )
    loaded = {}

    class Model:
        def state_dict(self):
            return model

        def load_state_dict(self, sd):
            loaded.update(sd)

    exec(by["load_state_dict"].call, {"model": Model(), "state_dict": dict.fromkeys(ckpt, 0)})
    assert set(loaded) == set(model)


def test_a_plain_model_gets_only_the_load_state_dict_call_with_its_rename():
    """A DDP-prefixed checkpoint of a plain nn.Module: one loader, fits after the rename, and the call loads it."""
    from torch_skills.checkpoint.loaders import loader_calls

    report = compare_state_dicts({"module.fc.weight": E}, {"fc.weight": E})
    [call] = loader_calls(report, report, library_keys={}, hf=None, folder=None)
    assert call.loader == "load_state_dict" and call.fits and not call.fits_as_is
    assert call.call.endswith("model.load_state_dict(state_dict)") and "module." in call.call


def test_a_model_folder_with_config_gets_from_pretrained_of_the_folder():
    """A fitting Hugging Face model folder: from_pretrained(folder) is the call, and load_state_dict fits as is too."""
    from torch_skills.checkpoint.loaders import HFClass, loader_calls

    report = compare_state_dicts({"fc.weight": E}, {"fc.weight": E})
    calls = loader_calls(
        report,
        report,
        library_keys={},
        hf=HFClass("GPT2Model", "transformers", "transformer"),
        folder="out/m",
    )
    assert calls[1].call == "from transformers import GPT2Model\nmodel = GPT2Model.from_pretrained('out/m')"
    assert all(c.fits_as_is for c in calls)


def test_a_prefix_fix_that_needs_the_library_s_renames_too_does_not_promise_load_state_dict():
    """A DDP prefix on keys only from_pretrained renames: the advice names from_pretrained, not load_state_dict."""
    from torch_skills.checkpoint.loaders import HFClass, loader_calls
    from torch_skills.checkpoint.models import VerifyCheckpointResult
    from torch_skills.checkpoint.report import _fit_findings
    from torch_skills.checkpoint.worker import _key_mismatch

    rename = LibraryRename("test loader", lambda k: k.replace(".gamma", ".weight"))
    ckpt = {"module.norm.gamma": E, "module.fc.weight": E}
    model = {"norm.weight": E, "fc.weight": E}
    with_library = compare_state_dicts(ckpt, model, library=rename)
    plain = compare_state_dicts(ckpt, model)
    calls = loader_calls(
        with_library,
        plain,
        library_keys={k: rename.rename(k) for k in ckpt},
        hf=HFClass("Net", "transformers", ""),
        folder=None,
    )
    result = VerifyCheckpointResult.model_construct(
        key_mismatch=_key_mismatch("(the whole file)", with_library, 50, calls), adapter=None, path="x.pt"
    )
    [prefix] = [f for f in _fit_findings(result) if f.code == "key_prefix_mismatch"]
    assert (
        "Then load with from_pretrained" in prefix.message and "Before load_state_dict" not in prefix.message
    )
    assert not calls[0].fits and calls[1].fits and "Net.from_pretrained(None" in calls[1].call
