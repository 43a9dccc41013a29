"""The reference rule is an allow-list: every gadget of issue 21 is refused before anything is called.

A code reference runs only when it is the user's own code under a root, an installed
torch.nn.Module subclass, or a listed model factory with the arguments its entry accepts. The
fake distribution of `tests.fake_gadgets` leaves a file when any of its callables is called: no
file may appear. The real gadgets are refused through the tools with the rule in the message.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from mcp import Client

from tests.fake_gadgets import DIST, GADGETS, install_fake_gadgets
from tests.owned import entered_in_own_task
from torch_skills.refpolicy import ReferenceRefused, check_model_kwargs, check_reference, factory_named
from torch_skills.runner.codeimport import import_reference
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.usercode import load_loss
from torch_skills.server import build_server
from torch_skills.userspec import CodeRef

ALLOWED_TEXT = "may name"  # the model rule's sentence that says what IS allowed


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """The fake gadget distribution on sys.path; its modules are forgotten afterwards."""
    site, markers = install_fake_gadgets(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    yield site, markers
    for name in [m for m in sys.modules if m == DIST or m.startswith(DIST + ".")]:
        del sys.modules[name]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    return root


@pytest.mark.parametrize("reference", GADGETS)
def test_every_gadget_shape_from_an_installed_package_is_refused_before_it_is_called(
    fake_dist: tuple[Path, Path], project: Path, reference: str
):
    """run, expand, edit, Config, load, from_pretrained, main, memmap...: refused; the sentinel file never appears."""
    _, markers = fake_dist
    try:
        ref = CodeRef.parse(reference)
        check_reference(ref, "model", cwd=project)  # the server's check may refuse it first
        with pytest.raises(UserCodeError) as err:
            factory = import_reference(reference, project, [project], "the model factory", role="model")
            factory(command="touch x")  # only reached if the rule admitted it
        text = err.value.message
    except ReferenceRefused as exc:
        text = str(exc)
    assert "refused" in text and ALLOWED_TEXT in text and "Fix:" in text, text
    assert list(markers.iterdir()) == [], reference


def test_an_installed_module_class_from_the_same_package_is_admitted(
    fake_dist: tuple[Path, Path], project: Path
):
    """The positive control: the fake package counts as installed, and its nn.Module subclass runs."""
    net = import_reference(f"{DIST}:TinyNet", project, [project], "the model factory", role="model")(width=4)
    assert type(net).__name__ == "TinyNet"


@pytest.mark.parametrize("role", ["inputs", "loss", "data", "function"])
def test_inputs_loss_data_and_function_from_an_installed_package_are_refused(
    fake_dist: tuple[Path, Path], project: Path, role: str
):
    """Only files under a root (and torch.nn loss classes for loss) may be these; an installed module is not imported."""
    _, markers = fake_dist
    with pytest.raises(ReferenceRefused) as err:
        check_reference(CodeRef.parse(f"{DIST}:TinyNet"), role, cwd=project)
    assert f"`{role}` must name a callable in a file under an allowed root" in str(err.value)
    with pytest.raises(UserCodeError) as err:
        import_reference(f"{DIST}:main", project, [project], "x", role=role)
    assert "refused" in err.value.message and DIST not in sys.modules
    assert list(markers.iterdir()) == []


def test_a_project_file_that_re_exports_an_installed_callable_is_refused(fake_dist, project: Path):
    """`build = ts_fake_gadgets.main` in the user's file: the object is judged where it was defined."""
    _, markers = fake_dist
    (project / "reexport.py").write_text(
        f"import torch\nfrom {DIST} import main as build, TinyNet\nlinear = torch.nn.Linear\nnet = TinyNet\n"
    )
    with pytest.raises(UserCodeError) as err:
        import_reference(f"{project / 'reexport.py'}:build", project, [project], "m", role="model")
    assert "defined outside the allowed roots" in err.value.message
    assert (
        import_reference(f"{project / 'reexport.py'}:linear", project, [project], "m", role="model")
        is not None
    )
    assert (
        import_reference(f"{project / 'reexport.py'}:net", project, [project], "m", role="model") is not None
    )
    assert list(markers.iterdir()) == []


def test_the_users_own_factory_and_functions_are_admitted_for_every_role(project: Path):
    """A factory, an inputs function and a loss function in the user's file run as before."""
    (project / "m.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Linear(4, 2)\n"
        "def make_inputs():\n    return torch.randn(2, 4)\ndef loss_fn(out, batch):\n    return out.sum()\n"
    )
    for name, role in (("build", "model"), ("make_inputs", "inputs"), ("loss_fn", "loss"), ("build", "data")):
        assert callable(import_reference(f"{project / 'm.py'}:{name}", project, [project], "x", role=role))


def test_a_torch_nn_loss_class_is_a_loss_built_without_arguments(project: Path):
    """loss='torch.nn:CrossEntropyLoss' is called on (the output, the batch's target)."""
    import torch

    loss = load_loss("torch.nn:CrossEntropyLoss", project, [project])
    logits, target = torch.randn(3, 5), torch.tensor([0, 1, 4])
    assert torch.allclose(
        loss(logits, (torch.zeros(3, 4), target)), torch.nn.functional.cross_entropy(logits, target)
    )
    with pytest.raises(UserCodeError):
        import_reference("torch.nn:functional", project, [project], "x", role="loss")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"trust_remote_code": True}, "trust_remote_code"),
        ({"config": {"auto_map": {"AutoModel": "x--y.Z"}}}, "auto_map"),
        ({"pretrained": True}, "pretrained"),
        ({"weights": "IMAGENET1K_V1"}, "weights"),
        ({"name": "some-org/some-model"}, "hub id"),
        ({"name": "https://example.com/model.bin"}, "download"),
        ({"name": "hf-hub:timm/resnet18"}, "download"),
        ({"path": "/etc/passwd"}, "outside the allowed roots"),
        ({"files": ["../../outside.pt"]}, "outside the allowed roots"),
        ({"factory": "os:system"}, "names a callable"),
        ({"factory": "os.system"}, "names a callable"),
        ({"factory": "pkg.mod.fn"}, "names a callable"),
        ({"handlers": {"h": {"()": "logging.config.dictConfig"}}}, "names a callable"),
    ],
)
def test_model_kwargs_that_download_load_or_name_code_are_refused(project: Path, kwargs: dict, says: str):
    """trust_remote_code, download flags, hub ids, URLs, paths outside the roots, callables by name."""
    with pytest.raises(ReferenceRefused) as err:
        check_model_kwargs(kwargs, project, [project])
    assert says in str(err.value) and "Fix:" in str(err.value), str(err.value)


def test_plain_sizes_names_and_paths_under_the_roots_pass(project: Path):
    """Numbers, words, nested configs and a file under the root are what model_kwargs are for."""
    (project / "cfg.json").write_text("{}")
    check_model_kwargs(
        {
            "layers": 2,
            "act": "gelu",
            "config": {"model_type": "bert", "hidden_size": 32, "pretrained": False},
            "cfg": str(project / "cfg.json"),
            "weights": None,
            "model_name": "vit_base_patch16_224.augreg_in21k",
        },
        project,
        [project],
    )


def test_listed_factories_take_only_their_arguments_and_no_download():
    """timm:create_model with pretrained=True, or an argument it does not list, is refused by name."""
    timm = factory_named(CodeRef.parse("timm:create_model"))
    assert timm is not None
    check_model_kwargs(
        {"model_name": "resnet18", "pretrained": False, "num_classes": 10}, Path("."), [], timm
    )
    for bad in (
        {"model_name": "resnet18", "pretrained": True},
        {"model_name": "resnet18", "checkpoint_path": ""},
    ):
        with pytest.raises(ReferenceRefused):
            check_model_kwargs(bad, Path("."), [], timm)
    tv = factory_named(CodeRef.parse("torchvision.models:resnet18"))
    assert tv is not None and tv.family == "torchvision"
    with pytest.raises(ReferenceRefused):
        check_model_kwargs({"weights": "DEFAULT"}, Path("."), [], tv)
    assert factory_named(CodeRef.parse("transformers:AutoModel.from_config")) is not None
    assert factory_named(CodeRef.parse("transformers:AutoModel.from_pretrained")) is None


@pytest.mark.slow
def test_a_transformers_model_class_and_from_config_build_from_a_json_config(project: Path):
    """transformers:BertModel and AutoModel.from_config take {"config": {...}}; from_pretrained is refused."""
    pytest.importorskip("transformers")
    config = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 37, "vocab_size": 99}  # fmt: skip
    bert = import_reference("transformers:BertModel", project, [project], "m", role="model")(config=config)
    auto = import_reference("transformers:AutoModel.from_config", project, [project], "m", role="model")
    assert type(bert).__name__ == type(auto(config=config)).__name__ == "BertModel"
    with pytest.raises(ReferenceRefused):
        auto(config=config, trust_remote_code=True)
    with pytest.raises(ReferenceRefused):
        check_reference(CodeRef.parse("transformers:AutoModel.from_pretrained"), "model", cwd=project)


# -- the real gadgets of issue 21, through the tools -------------------------------------------------
@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gadgets")
    (root / "project").mkdir()
    (root / "outside").mkdir()
    return root


@pytest.fixture(scope="module")
async def client(sandbox: Path) -> AsyncIterator[Client]:
    async with entered_in_own_task(lambda: Client(build_server(allow=[sandbox / "project"]))) as c:
        yield c


def _real_gadgets(sandbox: Path) -> list[tuple[str, dict, Path | None]]:
    out, project = sandbox / "outside", sandbox / "project"
    return [
        ("torch.utils.collect_env:run", {"command": f"touch {out / 'collect_env'}"}, out / "collect_env"),
        ("sympy:expand", {"e": f"__import__('os').system('touch {out / 'sympy'}')"}, out / "sympy"),
        (
            "sympy:simplify",
            {"expr": f"__import__('os').system('touch {out / 'simplify'}')"},
            out / "simplify",
        ),
        ("click:edit", {"text": "x", "editor": f"touch {out / 'click'}"}, out / "click"),
        ("uvicorn:Config", {"app": "x"}, None),
        ("torch.export:load", {}, None),
        ("transformers:AutoModel.from_pretrained", {}, None),
        ("pytest:main", {"args": ["--version"]}, None),
        (
            "numpy:memmap",
            {"filename": str(project / "memmap.dat"), "mode": "w+", "shape": [1]},
            project / "memmap.dat",
        ),
    ]


def test_the_real_gadgets_of_issue_21_are_refused_by_the_worker_check(sandbox: Path):
    """In the worker's import path, each real gadget is refused after the import and before any call."""
    project = sandbox / "project"
    for model, kwargs, marker in _real_gadgets(sandbox):
        with pytest.raises((UserCodeError, ReferenceRefused)) as err:
            check_reference(CodeRef.parse(model), "model", cwd=project)
            import_reference(model, project, [project], "the model factory", role="model")(**kwargs)
        text = str(err.value)
        assert "refused" in text and ALLOWED_TEXT in text, (model, text)
        assert marker is None or not marker.exists(), model


@pytest.mark.slow  # one worker and the imports of sympy, click, uvicorn, numpy: about 15 s
async def test_the_real_gadgets_of_issue_21_are_refused_by_the_tools_and_nothing_runs(
    client: Client, sandbox: Path
):
    """collect_env:run, sympy, click:edit, uvicorn:Config, torch.export:load, from_pretrained, pytest:main, memmap."""
    for model, kwargs, marker in _real_gadgets(sandbox):
        result = await client.call_tool(
            "check_gradients",
            {"model": model, "model_kwargs": kwargs, "input_shape": [2, 4], "device": "cpu"},
        )
        text = result.content[0].text
        assert result.is_error and "refused" in text and ALLOWED_TEXT in text, (model, text)
        assert marker is None or not marker.exists(), model


def test_an_installed_package_inside_a_root_is_not_the_users_own_code(tmp_path: Path, monkeypatch):
    """A .venv inside the project: a file reference into its site-packages gets the installed-package rule."""
    project = tmp_path / "proj"
    project.mkdir()
    site, markers = install_fake_gadgets(project)  # project/fake-env/site-packages, under the root
    monkeypatch.syspath_prepend(str(site))
    try:
        for name in ("main", "Config", "create_model"):
            with pytest.raises(UserCodeError) as err:
                import_reference(
                    f"{site / DIST / '__init__.py'}:{name}", project, [project], "m", role="model"
                )()
            assert "refused" in err.value.message, err.value.message
        with pytest.raises(UserCodeError):
            import_reference(f"{site / DIST / 'export.py'}:load", project, [project], "m", role="inputs")
        assert list(markers.iterdir()) == []
    finally:
        for mod in [m for m in sys.modules if m == DIST or m.startswith(DIST + ".")]:
            del sys.modules[mod]


def test_a_timm_style_listed_factory_runs_with_its_arguments_and_never_with_pretrained(
    tmp_path: Path, monkeypatch
):
    """timm:create_model (a stand-in timm distribution) builds a model; pretrained=True is refused before the call."""
    from tests.fake_gadgets import install_fake_timm

    project = tmp_path / "proj"
    project.mkdir()
    site, markers = install_fake_timm(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    for mod in [m for m in sys.modules if m == "timm" or m.startswith("timm.")]:
        monkeypatch.delitem(sys.modules, mod)
    try:
        create = import_reference("timm:create_model", project, [project], "m", role="model")
        assert type(create(model_name="resnet18", num_classes=3)).__name__ == "Sequential"
        with pytest.raises(ReferenceRefused, match="pretrained"):
            create(model_name="resnet18", pretrained=True)
        with pytest.raises(ReferenceRefused, match="checkpoint_path"):
            create(model_name="resnet18", checkpoint_path=str(project / "w.pth"))
        assert list(markers.iterdir()) == []
    finally:
        for mod in [m for m in sys.modules if m == "timm" or m.startswith("timm.")]:
            del sys.modules[mod]


TOOLS = ("check_gradients", "estimate_memory", "profile_model", "verify_checkpoint")
BERT = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 37, "vocab_size": 99}  # fmt: skip


@pytest.fixture(scope="module")
def hf_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with the user's own factory and a checkpoint of the tiny BERT."""
    transformers = pytest.importorskip("transformers")
    import torch

    root = tmp_path_factory.mktemp("hf")
    (root / "m.py").write_text("import torch\n\ndef build(width=8):\n    return torch.nn.Linear(width, 2)\n")
    config = transformers.BertConfig(**{k: v for k, v in BERT.items() if k != "model_type"})
    torch.save(transformers.BertModel(config).state_dict(), root / "bert.pt")
    torch.save(torch.nn.Linear(8, 2).state_dict(), root / "linear.pt")
    return root


@pytest.fixture(scope="module")
async def hf_client(hf_project: Path) -> AsyncIterator[Client]:
    async with entered_in_own_task(lambda: Client(build_server(allow=[hf_project]))) as c:
        yield c


@pytest.mark.slow  # transformers in the worker, four tools, two models: about a minute
@pytest.mark.parametrize("tool", TOOLS)
async def test_a_transformers_class_from_a_json_config_and_a_users_factory_work_through_every_tool(
    hf_client: Client, hf_project: Path, tool: str
):
    """transformers:BertModel with {"config": {...}}, AutoModel.from_config and 'm.py:build' run in every tool."""
    cases = [
        ("transformers:BertModel", {"config": BERT}, [2, 8], "int64", "bert.pt"),
        ("transformers:AutoModel.from_config", {"config": BERT}, [2, 8], "int64", "bert.pt"),
        (f"{hf_project / 'm.py'}:build", {"width": 8}, [2, 8], "float32", "linear.pt"),
    ]
    for model, kwargs, shape, dtype, ckpt in cases:
        args = {
            "model": model,
            "model_kwargs": kwargs,
            "input_shape": shape,
            "input_dtype": dtype,
            "device": "cpu",
        }
        if tool == "verify_checkpoint":
            args = {"model": model, "model_kwargs": kwargs, "path": str(hf_project / ckpt)}
        if tool == "profile_model":
            args |= {"warmup_steps": 1, "active_steps": 3}
        result = await hf_client.call_tool(tool, args)
        assert not result.is_error, (tool, model, result.content[0].text[:2000])
