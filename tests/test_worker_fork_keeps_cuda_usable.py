"""A forked call child can use CUDA: the zygote never sets up the driver, the child keeps its device files.

Measured on an H100: with the zygote calling torch.cuda.is_available() (through NVML) and the child closing
every inherited descriptor, every CUDA call of every tool failed with "CUDA error: initialization error".
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from torch_skills.runner.child import resolve_device

TOOLS = str(Path(__file__).resolve().parents[1] / "tools")

CHECK = """
import os, sys
sys.path.insert(0, {tools!r})
from torch_skills.runner.child import close_inherited_fds
kept = os.open({kept!r}, os.O_RDONLY)
dropped = os.open({dropped!r}, os.O_RDONLY)
close_inherited_fds(keep_prefixes=({kept!r},))
def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
print(is_open(kept), is_open(dropped))
"""


def test_the_child_keeps_the_driver_files_open_and_closes_every_other_inherited_descriptor():
    """Descriptors on the kept prefix (the GPU driver's /dev/nvidia* files) survive; the rest close."""
    with tempfile.TemporaryDirectory() as tmp:
        kept, dropped = Path(tmp, "nvidia-like"), Path(tmp, "other-job-pipe")
        kept.write_text("")
        dropped.write_text("")
        code = CHECK.format(tools=TOOLS, kept=str(kept), dropped=str(dropped))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "False"], out.stderr


def test_the_device_is_resolved_in_the_child_from_what_the_call_asked():
    """'cpu' and 'cuda' pass through; 'auto' asks torch in the child (CPU here, and in a worker without torch)."""
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("cuda") == "cuda"
    import torch

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def test_the_zygote_never_asks_cuda_before_it_forks():
    """No torch.cuda call in the zygote's code: a driver or NVML set up there is unusable in its children."""
    source = (Path(TOOLS) / "torch_skills" / "runner" / "zygote.py").read_text()
    code_lines = [ln.split("#", 1)[0] for ln in source.splitlines()]
    assert not [ln for ln in code_lines if "torch.cuda" in ln]
