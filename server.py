"""torch-skills MCP server, run from a clone: `python server.py [--help]`.

The server itself is the `torch_skills` package (this repository's `tools/`, `skills/` and
`examples/`, installed as one package by `pip install .`, whose command is `torch-skills`). This
file loads the package from this clone, wherever it is run from, and hands over to its command
line (`torch_skills.cli`).
"""

import importlib.util
import sys
from pathlib import Path


def _import_clone_package() -> None:
    bootstrap = Path(__file__).resolve().parent / "tools" / "bootstrap.py"
    spec = importlib.util.spec_from_file_location("torch_skills_bootstrap", bootstrap)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.import_package()


_import_clone_package()

if __name__ == "__main__":
    from torch_skills.cli import main

    sys.exit(main())
