"""Abuse matrix, roots: / , ~ and system folders are never roots; the error says what to do instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client

from torch_skills.roots import AllowedRoots, PathNotAllowed, RootTooBroad, too_broad
from torch_skills.server import build_server

REPO = Path(__file__).resolve().parents[1]
MODEL = "import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n"


@pytest.mark.parametrize("folder", ["/", str(Path.home()), "/usr", "/usr/lib", "/etc", "/tmp", "/proc/self"])
def test_the_working_directory_counts_only_when_it_is_a_project(folder: str):
    """Started in /, ~ or a system folder, the server's working directory is not a root."""
    roots = AllowedRoots(Path(folder))
    assert not roots.cwd_is_root and roots.all == ()
    with pytest.raises(PathNotAllowed) as err:
        roots.check(Path(folder) / "anything.py")
    assert "is not a root" in str(err.value) and "--allow" in str(err.value)


def test_a_project_folder_is_still_a_root(tmp_path: Path):
    """A real project (here a folder under the temp dir) stays the implicit root."""
    roots = AllowedRoots(tmp_path)
    assert roots.cwd_is_root and roots.check(tmp_path / "m.py") == tmp_path / "m.py"


@pytest.mark.parametrize("folder", ["/", str(Path.home()), "/usr", "/etc/ssl"])
def test_allow_with_the_root_the_home_or_a_system_folder_is_refused(tmp_path: Path, folder: str):
    """--allow / (or ~, /usr, ...) would open the whole disk: refused with the reason."""
    with pytest.raises(RootTooBroad) as err:
        AllowedRoots(tmp_path, (Path(folder),))
    assert "refused" in str(err.value) and too_broad(folder) in str(err.value)


def test_the_command_line_refuses_allow_slash_at_start_up():
    """`torch-skills --allow /` exits with status 2 and says why, before serving anything."""
    out = subprocess.run(
        [sys.executable, "server.py", "--allow", "/", "--no-prewarm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2 and "--allow / is refused" in out.stderr


def test_a_client_root_of_slash_or_home_is_ignored(tmp_path: Path):
    """A client offering file:/// or ~ as a root does not open the disk; its project roots still count."""
    roots = AllowedRoots(Path("/")).with_client_roots(["file:///", Path.home().as_uri(), tmp_path.as_uri()])
    assert roots.all == (tmp_path.resolve(),)


async def test_a_server_started_in_slash_refuses_files_and_says_the_cwd_is_not_a_root(
    tmp_path: Path, monkeypatch
):
    """Desktop clients start servers in /: a model anywhere is refused with the reason and the fix."""
    (tmp_path / "m.py").write_text(MODEL)
    monkeypatch.chdir("/")
    server = build_server(prewarm=False)
    monkeypatch.chdir(os.fspath(REPO))
    async with Client(server) as client:
        result = await client.call_tool(
            "check_gradients", {"model": f"{tmp_path / 'm.py'}:build", "input_shape": [2, 4]}
        )
    text = result.content[0].text
    assert result.is_error and "the file system root" in text and "--allow" in text
