"""What this machine attains right now: matmul FLOP/s, copy bandwidth, the cost of one tiny op.

Use `calibrate(torch.device("cpu"), torch.float32)` -> `Calibration(...)`. The profile compares the
user's step with these figures, measured in the same process under the same load, so the ratios
hold on a busy machine too. Each figure is the fastest of a few repetitions after a warm-up: load
only ever adds time (a descheduled thread, a stolen core), so the fastest repetition is the one
closest to what the machine attains, and classify.py compares it with the step's fastest time.
The matmul size doubles from 256 until one matmul takes long enough to be past launch and cache
effects (or the size cap is reached), and the best size counts.

Known limitations: one large square matmul is the attainable rate, not the datasheet peak (see
peaks.py for that); the copy is a device-to-same-device copy of a buffer larger than any cache on
CPUs we know of, which approximates main-memory bandwidth.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

REPEATS = 5
MATMUL_START = 256
MATMUL_CAP = {"cpu": 2048, "cuda": 8192}
MATMUL_LONG_ENOUGH_S = {"cpu": 0.01, "cuda": 0.002}  # one matmul this long is past fixed costs
COPY_BYTES = {"cpu": 64 * 2**20, "cuda": 256 * 2**20}  # larger than the last-level cache / L2
TINY_OPS_PER_REPEAT = 200


@dataclass(frozen=True)
class Calibration:
    matmul_flops_per_s: float
    matmul_size: int
    copy_bytes_per_s: float
    tiny_op_s: float
    spread: float = (
        1.0  # slowest / fastest repetition of the matmul and the copy, the larger: above ~2, contended
    )


def synchronizer(device: torch.device) -> Callable[[], None]:
    """`torch.cuda.synchronize` on a GPU, a no-op on the CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _times(fn: Callable[[], object], sync: Callable[[], None], repeats: int = REPEATS) -> list[float]:
    """`repeats` timed calls after one untimed call."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def _spread(times: list[float]) -> float:
    return max(times) / min(times) if min(times) > 0 else 1.0


def matmul_rate(device: torch.device, dtype: torch.dtype) -> tuple[float, int, float]:
    """(FLOP/s, size, spread of its repetitions) of the best square matmul size on this device and dtype."""
    sync = synchronizer(device)
    kind = device.type if device.type in MATMUL_CAP else "cpu"
    best, best_n, best_spread, n = 0.0, MATMUL_START, 1.0, MATMUL_START
    while n <= MATMUL_CAP[kind]:
        a = torch.randn(n, n, device=device).to(dtype)  # (n, n)
        b = torch.randn(n, n, device=device).to(dtype)  # (n, n)
        times = _times(lambda a=a, b=b: torch.mm(a, b), sync, repeats=3)
        rate = 2 * n**3 / min(times)  # a (n, n) @ (n, n) matmul is n^2 dot products of length n
        if rate > best:
            best, best_n, best_spread = rate, n, _spread(times)
        if min(times) >= MATMUL_LONG_ENOUGH_S[kind]:
            break
        n *= 2
    return best, best_n, best_spread


def copy_rate(device: torch.device) -> tuple[float, float]:
    """(Bytes/s, spread of its repetitions) of a large same-device copy (each byte read once and written once)."""
    sync = synchronizer(device)
    numel = COPY_BYTES.get(device.type, COPY_BYTES["cpu"]) // 4
    src = torch.ones(numel, device=device)
    dst = torch.empty_like(src)
    times = _times(lambda: dst.copy_(src), sync)
    return 2 * src.nbytes / min(times), _spread(times)


def tiny_op_cost(device: torch.device) -> float:
    """Seconds to dispatch one op on one-element tensors from Python (launch cost on a GPU)."""
    sync = synchronizer(device)
    a = torch.ones(1, device=device)
    b = torch.ones(1, device=device)

    def loop() -> None:
        for _ in range(TINY_OPS_PER_REPEAT):
            torch.add(a, b)

    return min(_times(loop, sync)) / TINY_OPS_PER_REPEAT


def calibrate(device: torch.device, dtype: torch.dtype) -> Calibration:
    """Measure the three reference figures; about 0.3 s on a CPU, less on a GPU."""
    with torch.no_grad():
        flops, size, matmul_spread = matmul_rate(device, dtype)
        copy, copy_spread = copy_rate(device)
        return Calibration(
            matmul_flops_per_s=flops,
            matmul_size=size,
            copy_bytes_per_s=copy,
            tiny_op_s=tiny_op_cost(device),
            spread=max(matmul_spread, copy_spread),
        )
