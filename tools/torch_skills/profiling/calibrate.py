"""What this machine attains right now: matmul FLOP/s, copy bandwidth, the cost of one tiny op.

Use `calibrate(torch.device("cpu"), torch.float32)` -> `Calibration(...)`. The profile compares the
user's step with these figures, measured in the same process under the same load, so the ratios
hold on a busy machine too. Each figure is the median of a few repetitions after a warm-up; the
matmul size doubles from 256 until one matmul takes long enough to be past launch and cache
effects (or the size cap is reached), and the best size's median counts.

Known limitations: one large square matmul is the attainable rate, not the datasheet peak (see
peaks.py for that); the copy is a device-to-same-device copy of a buffer larger than any cache on
CPUs we know of, which approximates main-memory bandwidth.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

REPEATS = 5
MATMUL_START = 256
MATMUL_CAP = {"cpu": 2048, "cuda": 8192}
MATMUL_LONG_ENOUGH_S = {"cpu": 0.02, "cuda": 0.002}  # one matmul this long is past fixed costs
COPY_BYTES = {"cpu": 64 * 2**20, "cuda": 256 * 2**20}  # larger than the last-level cache / L2
TINY_OPS_PER_REPEAT = 200


@dataclass(frozen=True)
class Calibration:
    matmul_flops_per_s: float
    matmul_size: int
    copy_bytes_per_s: float
    tiny_op_s: float


def synchronizer(device: torch.device) -> Callable[[], None]:
    """`torch.cuda.synchronize` on a GPU, a no-op on the CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _median_time(fn: Callable[[], object], sync: Callable[[], None], repeats: int = REPEATS) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_rate(device: torch.device, dtype: torch.dtype) -> tuple[float, int]:
    """(FLOP/s, size) of the best square matmul size on this device and dtype."""
    sync = synchronizer(device)
    kind = device.type if device.type in MATMUL_CAP else "cpu"
    best, best_n, n = 0.0, MATMUL_START, MATMUL_START
    while n <= MATMUL_CAP[kind]:
        a = torch.randn(n, n, device=device).to(dtype)  # (n, n)
        b = torch.randn(n, n, device=device).to(dtype)  # (n, n)
        seconds = _median_time(lambda a=a, b=b: torch.mm(a, b), sync, repeats=3)
        rate = 2 * n**3 / seconds  # a (n, n) @ (n, n) matmul is n^2 dot products of length n
        if rate > best:
            best, best_n = rate, n
        if seconds >= MATMUL_LONG_ENOUGH_S[kind]:
            break
        n *= 2
    return best, best_n


def copy_rate(device: torch.device) -> float:
    """Bytes/s of a large same-device copy (each byte read once and written once)."""
    sync = synchronizer(device)
    numel = COPY_BYTES.get(device.type, COPY_BYTES["cpu"]) // 4
    src = torch.ones(numel, device=device)
    dst = torch.empty_like(src)
    seconds = _median_time(lambda: dst.copy_(src), sync)
    return 2 * src.nbytes / seconds


def tiny_op_cost(device: torch.device) -> float:
    """Seconds to dispatch one op on one-element tensors from Python (launch cost on a GPU)."""
    sync = synchronizer(device)
    a = torch.ones(1, device=device)
    b = torch.ones(1, device=device)

    def loop() -> None:
        for _ in range(TINY_OPS_PER_REPEAT):
            torch.add(a, b)

    return _median_time(loop, sync) / TINY_OPS_PER_REPEAT


def calibrate(device: torch.device, dtype: torch.dtype) -> Calibration:
    """Measure the three reference figures; about 0.3 s on a CPU, less on a GPU."""
    with torch.no_grad():
        flops, size = matmul_rate(device, dtype)
        return Calibration(
            matmul_flops_per_s=flops,
            matmul_size=size,
            copy_bytes_per_s=copy_rate(device),
            tiny_op_s=tiny_op_cost(device),
        )
