"""A test-only installed distribution whose callables are named like real gadgets and leave a file when called.

Use `install_fake_gadgets(tmp_path)`: it writes `<tmp>/site-packages/ts_fake_gadgets/` with a
`.dist-info` (so importlib.metadata lists it as installed) and returns (site_dir, marker_dir).
Put site_dir on sys.path (or PYTHONPATH for a worker). Every callable listed in GADGETS writes
`marker_dir/<name>` when it is called, constructed or imported-and-run; TinyNet (an nn.Module
subclass) is the positive control that the rule admits.
"""

from __future__ import annotations

from pathlib import Path

DIST = "ts_fake_gadgets"

# References shaped like each gadget of issue 21, into the fake distribution.
GADGETS = (
    f"{DIST}.utils.collect_env:run",
    f"{DIST}:expand",
    f"{DIST}:simplify",
    f"{DIST}:edit",
    f"{DIST}:Config",
    f"{DIST}.export:load",
    f"{DIST}:AutoModel.from_pretrained",
    f"{DIST}:AutoModel.from_config",
    f"{DIST}:main",
    f"{DIST}:memmap",
    f"{DIST}:create_model",
    f"{DIST}:Factory",
)

_INIT = """
import os
import torch

MARKERS = {markers!r}


def _hit(name):
    open(os.path.join(MARKERS, name), "w").write("called")


def expand(*a, **k):
    _hit("expand")


def simplify(*a, **k):
    _hit("simplify")


def edit(*a, **k):
    _hit("edit")


def main(*a, **k):
    _hit("main")


def create_model(*a, **k):  # named like timm's, but not timm's
    _hit("create_model")
    return torch.nn.Linear(4, 2)


class Config:
    def __init__(self, *a, **k):
        _hit("Config")


class memmap:
    def __new__(cls, *a, **k):
        _hit("memmap")


class AutoModel:
    @classmethod
    def from_pretrained(cls, *a, **k):
        _hit("from_pretrained")

    @classmethod
    def from_config(cls, *a, **k):
        _hit("from_config")


class _Meta(type):
    def __call__(cls, *a, **k):
        _hit("Factory")


class Factory(metaclass=_Meta):
    pass


class TinyNet(torch.nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.fc = torch.nn.Linear(width, 2)

    def forward(self, x):
        return self.fc(x)
"""


def install_fake_gadgets(tmp_path: Path) -> tuple[Path, Path]:
    """Write the fake distribution under `tmp_path`; return (its site-packages folder, the marker folder)."""
    site = tmp_path / "fake-env" / "site-packages"
    markers = tmp_path / "markers"
    markers.mkdir(parents=True, exist_ok=True)
    pkg = site / DIST
    (pkg / "utils").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(_INIT.format(markers=str(markers)))
    (pkg / "utils" / "__init__.py").write_text("")
    (pkg / "utils" / "collect_env.py").write_text(
        f"from {DIST} import _hit\n\ndef run(command=None, *a, **k):\n    _hit('run')\n"
    )
    (pkg / "export.py").write_text(f"from {DIST} import _hit\n\ndef load(*a, **k):\n    _hit('load')\n")
    info = site / f"{DIST}-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text(f"{DIST}\n")
    (info / "RECORD").write_text("")
    return site, markers


_TIMM_FACTORY = """
import os
import torch

MARKERS = {markers!r}


def create_model(model_name, pretrained=False, num_classes=10, **kwargs):
    if pretrained:
        open(os.path.join(MARKERS, "downloaded"), "w").write(model_name)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))
"""


def install_fake_timm(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in `timm` distribution (timm.create_model defined in timm.models._factory, as in timm)
    whose create_model leaves a file when asked for pretrained weights; returns (site, markers)."""
    site = tmp_path / "fake-timm" / "site-packages"
    markers = tmp_path / "timm-markers"
    markers.mkdir(parents=True, exist_ok=True)
    (site / "timm" / "models").mkdir(parents=True, exist_ok=True)
    (site / "timm" / "__init__.py").write_text("from timm.models import create_model\n")
    (site / "timm" / "models" / "__init__.py").write_text("from timm.models._factory import create_model\n")
    (site / "timm" / "models" / "_factory.py").write_text(_TIMM_FACTORY.format(markers=str(markers)))
    info = site / "timm-0.0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: timm\nVersion: 0.0.1\n")
    (info / "top_level.txt").write_text("timm\n")
    return site, markers
