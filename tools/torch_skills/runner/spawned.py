"""A call child started as a fresh interpreter instead of a fork: how CUDA calls run.

Started by the zygote (`Zygote.start`) as

    python -c BOOT '<sys.path as JSON>' '<job message as JSON>' <output fd>

A forked child cannot use CUDA once anything in its parent set up the driver: torch marks its own
initialization, but a library that calls cuInit itself (Triton >= 3.7's NVIDIA backend probe runs
on import paths that torch._dynamo takes) leaves no mark, and the child then fails with "CUDA
error: initialization error" (measured on an H100: every CUDA call of every tool, while CPU calls
worked). A fresh interpreter has no such state. It costs the imports the warm worker had already
paid (torch and the tool's module, about 2-4 s), small beside CUDA's own start.

Known limitations: until the child has called setsid() (after those imports) it is in the
zygote's process group; a kill in that window goes through `proctree.kill_tree`.
"""

from __future__ import annotations

import importlib
import json
import sys

BOOT = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
    "from torch_skills.runner.spawned import main; main(sys.argv[2], int(sys.argv[3]))"
)


def command(message: dict, write_fd: int) -> list[str]:
    """The argv that runs `message` in a fresh interpreter writing its output to `write_fd`."""
    path = [p for p in sys.path if p]  # the zygote's: the worker package, never the working directory
    return [sys.executable, "-c", BOOT, json.dumps(path), json.dumps(message), str(write_fd)]


def main(message_json: str, write_fd: int) -> None:
    """Import what the warm worker would have held, then run the call like a forked child."""
    message = json.loads(message_json)
    import torch  # noqa: F401 - imported before run_child takes its module snapshot, as in the zygote

    try:
        importlib.import_module(str(message.get("fn", "")).partition(":")[0])
    except Exception:  # noqa: BLE001 - run_child imports it again and reports the failure properly
        pass
    from torch_skills.runner import child

    child.run_child(message, write_fd, -1)
