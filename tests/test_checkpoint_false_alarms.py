"""No false alarm on what is data or the user's own: joblib arrays, TorchScript code, a user's pickled model.

joblib's format is written by tests/fixtures/joblib_format.py the way joblib.dump writes it.
Nothing is unpickled by the scans.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import torch

from tests.checkpoint_support import scratch_dir
from tests.fixtures.joblib_format import joblib_bytes, scikit_like
from torch_skills.checkpoint.scan import scan_path
from torch_skills.checkpoint.verdict import overall_verdict

PAYLOAD = b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00true\x85R."


def test_joblib_arrays_with_their_raw_bytes_are_data(tmp_path):
    """The wrapper plus its raw bytes scans as data: no unsafe global, no parse error."""
    path = tmp_path / "model.joblib"
    path.write_bytes(joblib_bytes(scikit_like()))
    scan = scan_path(path)
    assert overall_verdict(scan) in ("safe", "safe_with_allowlist"), [p.message for p in scan.problems_all()]
    assert scan.unsafe_total() == 0


def test_a_payload_in_a_joblib_object_array_is_still_found(tmp_path):
    """An object array is a pickle joblib.load runs: posix.system there is unsafe."""
    path = tmp_path / "model.joblib"
    path.write_bytes(joblib_bytes({"x": np.array([1, None], dtype=object)}, raw_object=PAYLOAD))
    scan = scan_path(path)
    assert overall_verdict(scan) == "unsafe" and "posix.system" in {u.qualified for u in scan.unsafe()}


def test_a_payload_after_a_joblib_arrays_declared_bytes_is_found(tmp_path):
    """The scan skips exactly the declared bytes: a pickle glued after the array is still read."""
    data = joblib_bytes({"w": np.ones(4)})
    path = tmp_path / "model.joblib"
    path.write_bytes(data + PAYLOAD)
    scan = scan_path(path)
    assert "posix.system" in {u.qualified for u in scan.unsafe()}


async def test_a_joblib_file_loads_over_mcp_plain_and_compressed(client):
    """Both joblib.dump layouts (plain, zlib-compressed) are safe and opened by the allowlist reader."""
    folder = scratch_dir("joblib")
    raw = joblib_bytes(scikit_like())
    (folder / "plain.joblib").write_bytes(raw)
    (folder / "packed.joblib").write_bytes(zlib.compress(raw, 3))
    for name in ("plain.joblib", "packed.joblib"):
        r = await client.call_tool("verify_checkpoint", {"path": str(folder / name)})
        result = r.structured_content
        assert result["safe"] and result["loaded"] and not result["load_error"], (name, result["summary"])


# -- TorchScript ----------------------------------------------------------------------------------
class _Scripted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        return torch.relu(self.lin(x))


def test_torchscript_code_is_reported_as_code_with_its_file_names(tmp_path):
    """code/*.py files are named as code torch.jit.load runs, not parsed as pickles with garbage globals."""
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(_Scripted()), str(path))
    scan = scan_path(path)
    codes = {p.code for p in scan.problems_all()}
    assert overall_verdict(scan) == "unsafe" and "torchscript_archive" in codes
    assert scan.unsafe_total() == 0 and "unparseable_pickle" not in codes
    code_problem = next(p for p in scan.problems_all() if p.code == "torchscript_archive")
    assert "/code/__torch__" in code_problem.message and ".py" in code_problem.message


# -- a user's own pickled model -------------------------------------------------------------------
def _own_model_pickle(folder: Path) -> Path:
    """torch.save of a whole model whose class lives in the user's file under the roots."""
    source = folder / "mynet.py"
    source.write_text(
        "import torch\n\n\nclass MyNet(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 2)\n\n    def forward(self, x):\n        return self.fc(x)\n"
    )
    sys.path.insert(0, str(folder))
    try:
        import mynet  # the user's module, written above

        path = folder / "whole_model.pt"
        torch.save(mynet.MyNet(), path)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("mynet", None)
    return path


async def test_a_users_own_pickled_model_gets_its_own_finding_and_advice(client):
    """Only the user's class plus torch containers: named, with the state_dict re-save lines."""
    folder = scratch_dir("own-model")
    path = _own_model_pickle(folder)
    r = await client.call_tool("verify_checkpoint", {"path": str(path)})
    result = r.structured_content
    assert not result["safe"]
    finding = next(f for f in result["findings"] if f["code"] == "own_classes_only")
    assert "mynet.MyNet" in finding["message"] and "weights_only=False" in finding["message"]
    assert "state_dict()" in finding["message"] and "torch.save" in finding["message"]
    assert not any(f["code"] == "unsafe_global" for f in result["findings"])


async def test_a_call_to_a_users_function_is_not_called_own_classes(client):
    """A function (not a class) in the user's file, called by the pickle, keeps the unsafe wording."""
    folder = scratch_dir("own-function")
    (folder / "tasks.py").write_text("def wipe(path):\n    return path\n")
    path = folder / "calls.pkl"
    path.write_bytes(b"\x80\x02ctasks\nwipe\nX\x01\x00\x00\x00x\x85R.")
    r = await client.call_tool("verify_checkpoint", {"path": str(path)})
    codes = {f["code"] for f in r.structured_content["findings"]}
    assert "own_classes_only" not in codes and "unsafe_global" in codes


async def test_a_real_payload_beside_a_users_class_is_not_called_own_classes(client):
    """posix.system next to the user's class keeps the unsafe wording."""
    folder = scratch_dir("own-model-evil")
    path = _own_model_pickle(folder)
    evil = folder / "mixed.pkl"
    evil.write_bytes(
        b"\x80\x02(cmynet\nMyNet\n)\x81cposix\nsystem\nX\x04\x00\x00\x00true\x85Rl."  # [MyNet(), system('true')]
    )
    r = await client.call_tool("verify_checkpoint", {"path": str(evil)})
    result = r.structured_content
    codes = {f["code"] for f in result["findings"]}
    assert "own_classes_only" not in codes and "unsafe_global" in codes
    assert path.exists()
