"""The committed eval baseline: what is known to miss today, so anything else that misses is a regression.

`pytest evals/` fails when a query or scenario that passed at the baseline fails now.
After an intended change (a better router, a new scenario) refresh it with
`EVALS_UPDATE_BASELINE=1 pytest evals/` and review the diff of evals/baseline.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PATH = Path(__file__).with_name("baseline.json")


def updating() -> bool:
    return os.environ.get("EVALS_UPDATE_BASELINE") == "1"


def load() -> dict[str, Any]:
    return json.loads(PATH.read_text()) if PATH.exists() else {"routing": {}, "scenarios": {}}


def save_section(section: str, key: str, value: Any) -> None:
    data = load()
    data.setdefault(section, {})[key] = value
    PATH.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
