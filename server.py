"""torch-skills MCP server, run from a clone: `python server.py [--help]`.

The server is the `torch_skills` package in `tools/torch_skills/` (installed by `pip install .`,
whose command is `torch-skills`). This file puts `tools/` on the import path, which holds nothing
but that package, and hands over to its command line (`torch_skills.cli`).
"""

import sys
from pathlib import Path

_TOOLS = str(Path(__file__).resolve().parent / "tools")
if _TOOLS not in sys.path:
    sys.path.insert(0, _TOOLS)

if __name__ == "__main__":
    from torch_skills.cli import main

    sys.exit(main())
