"""Which step of the worker's start leaves CUDA unusable in a forked child? (a device diagnostic)

    python bench/gpu/forkcheck.py        # on a CUDA machine; prints one line per variant

The worker (torch_skills.runner.zygote) imports torch and the tools once, then forks a child per call.
A child can use CUDA only if its parent never initialized the driver. Each variant runs in a fresh
process: the parent does some of the zygote's steps, forks, and the child allocates on the GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import os, sys
sys.path[:0] = [{tools!r}, {repo!r}]
os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'
import torch
{parent}
pid = os.fork()
if pid == 0:
    {child_prep}
    try:
        torch.zeros(1, device='cuda').add_(1); torch.cuda.synchronize()
        os.write(1, b'child ok\\n')
    except BaseException as e:
        os.write(1, ('child FAILED: ' + repr(e)[:200] + '\\n').encode())
    os._exit(0)
os.waitpid(pid, 0)
print('parent cuda initialized:', torch.cuda.is_initialized())
"""

VARIANTS = {
    "import torch only": ("pass", "pass"),
    "is_available (NVML)": ("torch.cuda.is_available()", "pass"),
    "is_available + closerange in child": ("torch.cuda.is_available()", "os.closerange(3, 65536)"),
    "gradients warm_up": (
        "import torch_skills.gradients.worker as w; w.warm_up(); torch.cuda.is_available()",
        "pass",
    ),
    "import every tool module": (
        "import torch_skills.gradients.worker, torch_skills.profiling.worker, torch_skills.memory.worker, "
        "torch_skills.checkpoint.worker; torch.cuda.is_available()",
        "pass",
    ),
}


def main() -> None:
    for name, (parent, child_prep) in VARIANTS.items():
        code = CHILD.format(tools=str(REPO / "tools"), repo=str(REPO), parent=parent, child_prep=child_prep)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        out = " | ".join(line for line in (p.stdout + p.stderr[-300:]).splitlines() if line.strip())
        print(f"{name}: {out}", flush=True)


if __name__ == "__main__":
    main()
