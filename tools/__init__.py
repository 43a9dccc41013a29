"""torch-skills tool logic: plain Python and PyTorch, no MCP.

Use it through `server.py`, or call the pieces directly in tests. Modules whose names end in
`models` (request/result schemas), `runner.pool`, `roots`, `userspec` and `skillpack` never
import torch, so the server can import them at start-up; everything that needs torch lives in
modules that only the worker processes import.
"""
