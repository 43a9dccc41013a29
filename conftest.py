"""pytest set-up for a clone: `torch_skills` is this clone's `tools/torch_skills/`.

pyproject's `pythonpath` puts `tools/` (which holds only the package) first on the path, so the
clone's code is tested whether or not (and whatever version) torch-skills is also installed.
Worker processes started by the tests get the repository on PYTHONPATH, so test-only worker
functions (`tests.fixtures.*`) import there too; the product itself never puts the repository on
a worker's path.
"""

import os
from pathlib import Path

_REPO = str(Path(__file__).resolve().parent)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO, os.environ.get("PYTHONPATH")]))

pytest_plugins = ["tests.heartbeat"]
