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
