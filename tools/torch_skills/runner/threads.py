"""How many intra-op threads a tool run gets: the `cpu_threads` argument, or the idle cores.

Use `threads = run_threads(request.cpu_threads)` in a worker child (it calls
torch.set_num_threads; runner.child does it for every tool), `default_threads(cores, load,
torch_default)` to see the rule alone, and `rank_threads` to split it among distributed ranks.

The rule for cpu_threads=None: the cores this process may run on (sched_getaffinity) less the
1-minute load average, rounded to the nearest whole core, at least 1 and at most torch's own
default (one per physical core).

Why: torch's intra-op threads meet at a barrier after every op, so one thread that waits for a
busy core stalls them all. Measured on the 2-core project machine at load 6-8 (another job on
every core): a 14M-parameter GPT-2 AdamW step (batch 4 x 128) took 1.45 s on 1 thread and
8.48 s on 2; through the server, 2 threads (torch's default there, what the tools used before)
against this rule's 1, medians of 3 alternating calls: check_gradients 18.2 s vs 5.8 s on a 28M
BERT and 7.0 s vs 1.4 s on an 11M ResNet, estimate_memory 4.2 s vs 3.9 s and 5.7 s vs 3.2 s.
Users measured 7-10x (issue 26). A core counts as idle when it is less than half busy, so a
quiet machine keeps all its cores (not measured here: the machine was never quiet).

Known limitations: the load average lags a minute (a burst that just started is missed, one that
just ended still counts) and counts processes on cores outside this process's affinity mask; a
cgroup CPU quota is not read.
"""

from __future__ import annotations

import math
import os
import sys


def default_threads(cores: int, load: float | None, torch_default: int) -> int:
    """Threads for a run that did not ask: idle cores (cores - load, rounded), in [1, torch_default]."""
    idle = cores if load is None else math.floor(cores - load + 0.5)  # a core less than half busy is idle
    return max(1, min(idle, cores, torch_default))


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), or os.cpu_count() where the OS does not say."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average (runnable processes), or None where the OS does not say."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def rank_threads(requested: int | None, process_threads: int | None, ranks: int) -> int:
    """Threads for each of `ranks` processes run side by side: `requested` as given (it is per
    process), else this process's share of what the rule gave it (`process_threads`), at least 1."""
    if requested is not None:
        return requested
    return max(1, (process_threads or 1) // ranks)


def run_threads(requested: int | None) -> int | None:
    """Set torch's intra-op threads for this process to `requested`, or by the rule when None.
    Returns the count set, or None when torch is not loaded (a torch-free worker)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if requested is None:
        requested = default_threads(usable_cores(), load_average(), torch.get_num_threads())
    if torch.get_num_threads() != requested:
        torch.set_num_threads(requested)
    return torch.get_num_threads()
