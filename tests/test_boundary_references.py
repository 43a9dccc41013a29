"""Abuse matrix, code references: only the factory the user meant runs, and odd input gets a clear error.

Every torch tool takes `model` (and `inputs`, `loss`, ...) as a code reference. A reference that
would run a loader, a shell or the standard library is refused before anything is imported or
called, with the rule and the fix in the message; library model classes keep working; import
failures show the real error and its line; names no file can have are bad requests.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from tests.owned import entered_in_own_task
from torch_skills.refpolicy import ReferenceRefused, refuse_by_name, refuse_object
from torch_skills.runner.codeimport import import_reference
from torch_skills.runner.errors import UserCodeError
from torch_skills.server import build_server
from torch_skills.userspec import CodeRef

TOOLS = ("check_gradients", "estimate_memory", "profile_model", "verify_checkpoint", "check_distributed")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user project: a src/ package with relative imports, files that misbehave, a checkpoint."""
    import torch

    root = tmp_path_factory.mktemp("project")
    pkg = root / "src" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 2)\n")
    (pkg / "models.py").write_text("from .layers import make\n\ndef build():\n    return make()\n")
    (root / "alias.py").write_text("import os\nbuild = os.system\n")
    (root / "evil.py").write_text(f"open({str(root / 'ran-evil')!r}, 'w').write('x')\n")
    (root / "broken.py").write_text("import torch\nraise RuntimeError('boom at import')\n")
    (root / "needs_dep.py").write_text("import torch\nimport not_a_real_dependency_xyz\n")
    torch.save(torch.nn.Linear(4, 2).state_dict(), root / "linear.pt")
    return root


@pytest.fixture(scope="module")
async def client(project: Path) -> AsyncIterator[Client]:
    async with entered_in_own_task(lambda: Client(build_server(allow=[project]))) as c:
        yield c


def _arguments(tool: str, project: Path, model: str, **extra) -> dict:
    args = {"model": model, **extra}
    if tool == "verify_checkpoint":
        args["path"] = str(project / "linear.pt")
    else:
        args["input_shape"] = [2, 4]
    if tool == "profile_model":
        args |= {"warmup_steps": 1, "active_steps": 3}
    return args


def _hostile(project: Path) -> list[tuple[str, dict]]:
    marker = project / "ran-evil"
    return [
        ("os:system", {"command": f"touch {marker}"}),
        ("subprocess:run", {"args": ["touch", str(marker)]}),
        ("runpy:run_path", {"path_name": str(project / "evil.py")}),
        ("shutil:copyfile", {"src": str(project / "evil.py"), "dst": str(marker)}),
        ("builtins:exec", {"source": f"open({str(marker)!r}, 'w')"}),
        ("importlib:import_module", {"name": "evil"}),
        ("torch:load", {"f": str(project / "linear.pt"), "weights_only": False}),
        ("torch.hub:load", {"repo_or_dir": str(project), "model": "x", "source": "local"}),
        (f"{project / 'alias.py'}:build", {"command": f"touch {marker}"}),
        ("json:loads", {"s": "1"}),
        ("pickle:loads", {"data": b"x".hex()}),
    ]


@pytest.mark.parametrize("tool", TOOLS)
async def test_references_that_load_or_run_other_code_are_refused_by_every_tool(
    client: Client, project: Path, tool: str
):
    """os:system, runpy, shutil, exec, torch.load, the stdlib, an alias of os.system: refused, nothing runs."""
    for model, kwargs in _hostile(project):
        result = await client.call_tool(tool, _arguments(tool, project, model, model_kwargs=kwargs))
        text = result.content[0].text
        assert result.is_error, (tool, model, text)
        assert "refused" in text and "Fix:" in text, (tool, model, text)
        assert "[internal]" not in text
        assert not (project / "ran-evil").exists(), (tool, model)


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
@pytest.mark.parametrize("tool", TOOLS)
async def test_a_library_model_class_and_a_src_layout_package_still_work(
    client: Client, project: Path, tool: str
):
    """torch.nn:Linear (an installed class) and a file inside a package with relative imports both run."""
    lib = await client.call_tool(
        tool, _arguments(tool, project, "torch.nn:Linear", model_kwargs={"in_features": 4, "out_features": 2})
    )
    assert not lib.is_error, lib.content[0].text
    packaged = await client.call_tool(
        tool, _arguments(tool, project, f"{project / 'src/mypkg/models.py'}:build")
    )
    assert not packaged.is_error, packaged.content[0].text


@pytest.mark.parametrize("tool", TOOLS)
async def test_an_import_failure_shows_the_real_error_and_its_line_in_every_tool(
    client: Client, project: Path, tool: str
):
    """A file that raises while importing: the exception and broken.py:2, never 'no callable'."""
    result = await client.call_tool(tool, _arguments(tool, project, f"{project / 'broken.py'}:build"))
    text = result.content[0].text
    assert result.is_error
    assert "RuntimeError: boom at import" in text and "broken.py:2" in text, text
    assert "no callable" not in text


@pytest.mark.parametrize("tool", TOOLS)
async def test_a_missing_dependency_names_the_interpreter_and_what_to_install(
    client: Client, project: Path, tool: str
):
    """ModuleNotFoundError in the user's file: the module, the interpreter that ran, a pip command."""
    result = await client.call_tool(tool, _arguments(tool, project, f"{project / 'needs_dep.py'}:build"))
    text = result.content[0].text
    assert result.is_error and "not_a_real_dependency_xyz" in text and "-m pip install" in text, text


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize(
    ("name", "says"),
    [("models\x00.py:build", "NUL"), ("m" * 5000 + ".py:build", "4096"), ("mod\udc80.py:build", "UTF-8")],
)
async def test_nul_overlong_and_non_utf8_names_are_bad_requests_that_say_why(
    client: Client, project: Path, tool: str, name: str, says: str
):
    """A name no file can have is refused as the caller's mistake, naming what is wrong."""
    result = await client.call_tool(tool, _arguments(tool, project, name))
    text = result.content[0].text
    assert result.is_error and says in text, text
    assert "[internal]" not in text and "bug in the tool" not in text


@pytest.mark.parametrize(
    ("path", "says"), [("ck\x00.pt", "NUL"), ("c" * 5000 + ".pt", "4096"), ("ck\udcff.pt", "UTF-8")]
)
async def test_odd_checkpoint_paths_are_bad_requests(client: Client, path: str, says: str):
    """verify_checkpoint's own path argument gets the same checks."""
    result = await client.call_tool("verify_checkpoint", {"path": path})
    assert result.is_error and says in result.content[0].text, result.content[0].text


def test_a_module_outside_the_roots_is_refused_before_it_is_imported(tmp_path: Path, monkeypatch):
    """A module found on sys.path but outside every root never runs: its import side effect is absent."""
    outside, root = tmp_path / "outside", tmp_path / "root"
    outside.mkdir()
    root.mkdir()
    marker = tmp_path / "imported"
    (outside / "sneaky_mod_xyz.py").write_text(f"open({str(marker)!r}, 'w')\ndef build(): pass\n")
    monkeypatch.syspath_prepend(str(outside))
    with pytest.raises(UserCodeError) as err:
        import_reference("sneaky_mod_xyz:build", root, [root], "the model factory")
    assert err.value.kind == "bad_request" and "allowed root" in err.value.message
    assert not marker.exists() and "sneaky_mod_xyz" not in sys.modules


def test_a_src_layout_module_reference_and_relative_imports_resolve_from_the_project(project: Path):
    """'mypkg.models:build' resolves through the project's src/ folder; relative imports work."""
    build = import_reference("mypkg.models:build", project, [project], "the model factory")
    assert type(build()).__name__ == "Linear"


def test_a_failed_import_leaves_nothing_half_imported(project: Path):
    """After a failing import, importing again fails the same way (no empty module left in sys.modules)."""
    for _ in range(2):
        with pytest.raises(UserCodeError) as err:
            import_reference(f"{project / 'broken.py'}:build", project, [project], "the model factory")
        assert err.value.kind == "import_error" and "boom at import" in err.value.message


def test_refused_objects_are_recognised_however_they_are_reached():
    """Identity, not spelling: aliases, partials and bound methods of loaders are refused."""
    import functools
    import os
    import pickle

    import torch

    for obj in (
        os.system,
        eval,
        exec,
        torch.load,
        torch.jit.load,
        functools.partial(torch.load, "x"),
        pickle.loads,
    ):
        with pytest.raises(ReferenceRefused):
            refuse_object(obj, CodeRef.parse("m.py:build"))
    for obj in (torch.nn.Linear, torch.nn.Sequential, torch.randn):
        refuse_object(obj, CodeRef.parse("m.py:build"))
    with pytest.raises(ReferenceRefused):
        refuse_by_name(CodeRef.parse("torch.nn:Module.__subclasses__"))
