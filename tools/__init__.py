"""torch-skills: a PyTorch engineering skill pack and diagnostic tools for coding agents, over MCP.

Use it as the `torch-skills` command (`torch_skills.cli`), or build the server in Python with
`torch_skills.server.build_server()`; the pieces are plain Python you can call directly. In a
clone this folder is `tools/` and imports as `torch_skills` through `bootstrap.py`.

Modules whose names end in `models` (request/result schemas), `runner.pool`, `roots`,
`userspec`, `skillpack`, `torch_tools` and `server` never import torch, so the server can import
them at start-up; everything that needs torch lives in modules only the worker processes import.
"""

__version__ = "0.2.0"
