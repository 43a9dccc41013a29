"""pytest set-up for a clone: `torch_skills` is this clone's `tools/` (as `python server.py` sees it).

Importing the top-level `server.py` shim registers the package before any test module imports it,
whether or not (and whatever version) torch-skills is also pip-installed. Worker processes started
by the tests get the repository on PYTHONPATH, so test-only worker functions (`tests.fixtures.*`)
import there too; the product itself never puts the repository on a worker's path.
"""

import os
from pathlib import Path

import server  # noqa: F401  (registers torch_skills from this clone)

_REPO = str(Path(__file__).resolve().parent)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO, os.environ.get("PYTHONPATH")]))

pytest_plugins = ["tests.heartbeat"]
