"""Run the skills' CUDA-only code blocks (```python cuda) on the device, each as its own script.

Used by bench/gpu_check.py; by hand on a CUDA machine:

    python bench/gpu/skillblocks.py            # prints one JSON line per block as it ends: block, passed, seconds, detail
    python bench/gpu/skillblocks.py export-and-inference   # only blocks whose file:line holds one of the arguments

On CPU the test suite only compiles these blocks (torch_skills.skillpack.codeblocks); here each one runs
in a fresh process in a temporary folder with a timeout, the way a reader would paste it. A block tagged
`raises=Name` passes when it fails with that exception. Blocks that also need `torchrun`, or read its
LOCAL_RANK / WORLD_SIZE (scripts for several GPUs), are reported as not run: two NCCL ranks cannot share one GPU.

Known limitations: four blocks run at a time on the one GPU (they check behaviour, not speed; the timings
they print are not figures), 90 s each.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from torch_skills.skillpack.codeblocks import python_blocks  # noqa: E402
from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR  # noqa: E402

TIMEOUT_S = 90
PARALLEL = 4


def place(block) -> str:
    """'skill/file.md:line', how results name a block."""
    return f"{block.file.relative_to(DEFAULT_SKILLS_DIR).as_posix()}:{block.line}"


def cuda_blocks(only: list[str] | None = None):
    """The blocks tagged `cuda` and not `torchrun`; with `only`, those whose place holds one of its substrings."""
    blocks = [b for b in python_blocks([DEFAULT_SKILLS_DIR]) if "cuda" in b.tags and "torchrun" not in b.tags]
    return [b for b in blocks if not only or any(s in place(b) for s in only)]


def needs_a_launcher(block) -> bool:
    """A script written for `torchrun` on several GPUs (it reads the launcher's LOCAL_RANK / WORLD_SIZE)."""
    return any(
        f'"{name}"' in block.code or f"'{name}'" in block.code for name in ("LOCAL_RANK", "WORLD_SIZE")
    )


def run_block(block) -> dict:
    """Run one block as a script; passed when it exits 0 (or raises the named exception)."""
    where = place(block)
    if needs_a_launcher(block):
        return {
            "block": where,
            "passed": None,
            "seconds": 0.0,
            "detail": "a multi-GPU torchrun script: compiled only",
        }
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cuda_block_") as tmp:
        script = Path(tmp) / "block.py"
        script.write_text(block.code)
        try:
            p = subprocess.run([sys.executable, str(script)], cwd=tmp, capture_output=True, text=True,
                               timeout=TIMEOUT_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"block": where, "passed": False, "seconds": TIMEOUT_S, "detail": "timed out"}
    err = p.stderr
    cut = err.rfind("Traceback (most recent call last)")
    out = (p.stdout[-400:] + "\n" + (err[cut:] if cut >= 0 else err)[-1600:]).strip()
    expected_failure = block.raises is not None and p.returncode != 0 and block.raises in p.stderr
    passed = expected_failure if block.raises else p.returncode == 0
    return {"block": where, "passed": passed, "seconds": round(time.monotonic() - start, 2), "exit": p.returncode,
            "detail": f"exit {p.returncode}\n{out}"}  # fmt: skip


def main() -> None:
    with cf.ThreadPoolExecutor(PARALLEL) as pool:
        for done in cf.as_completed([pool.submit(run_block, b) for b in cuda_blocks(sys.argv[1:])]):
            print(json.dumps(done.result()), flush=True)  # a run cut short still leaves the blocks that ended


if __name__ == "__main__":
    main()
