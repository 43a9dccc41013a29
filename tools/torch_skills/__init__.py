"""torch-skills: a PyTorch engineering skill pack and diagnostic tools for coding agents, over MCP.

Use it as the `torch-skills` command (`torch_skills.cli`), or build the server in Python with
`torch_skills.server.build_server()`; the pieces are plain Python you can call directly. In a
clone this folder is `tools/torch_skills/` (`python server.py` puts `tools/` on the path).

Modules whose names end in `models` (request/result schemas), `runner.pool`, `roots`,
`userspec`, `skillpack`, `torch_tools` and `server` never import torch, so the server can import
them at start-up; everything that needs torch lives in modules only the worker processes import.
"""

import os as _os

__version__ = "0.2.0"

# This package's folder as its modules' frames name it (a link on the worker's path,
# `runner.interpreter.worker_package_dir`) and as stored on disk: where "our own frames" start.
_HERE = _os.path.dirname(_os.path.abspath(__file__))
OWN_DIRS: tuple[str, ...] = tuple(dict.fromkeys((_HERE + _os.sep, _os.path.realpath(_HERE) + _os.sep)))
