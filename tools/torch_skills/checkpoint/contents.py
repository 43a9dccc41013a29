"""What a loaded checkpoint holds: tensor count, bytes, dtypes, and NaN/Inf counts read in chunks.

Use (worker only, needs torch):

    summary = summarize_tensors(obj, max_listed=10)             # TensorSummary
    bad, scanned = find_nonfinite(obj, mapped_file=path)          # [NonfiniteTensor], bool

`find_nonfinite` visits every floating (and complex) tensor in pieces of at most
`CHUNK_ELEMENTS` elements, so its extra memory is one piece's masks whatever the checkpoint's
size. Tensors memory-mapped from the checkpoint file (torch.load(mmap=True)) have each piece's
pages handed back to the kernel after reading (madvise MADV_DONTNEED on the private, unmodified
mapping; they are re-read from the file if touched again), so resident memory stays bounded too.

Known limitations: a checkpoint larger than the worker's address-space limit (memory_limit_gib)
cannot be memory-mapped at all; raise memory_limit_gib for those.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from torch_skills.checkpoint.models import DTypeCount, NonfiniteTensor, TensorInfo, TensorSummary
from torch_skills.checkpoint.tree import MAX_NODES, TensorMeta, leaf_info, walk

CHUNK_ELEMENTS = 1 << 22  # 4M elements: 16 MiB of float32 per piece
_MADV_DONTNEED = 4  # <sys/mman.h>
_NATIVE_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def summarize_tensors(obj: Any, max_listed: int = 10) -> TensorSummary:
    """Count, bytes and dtype histogram of every tensor-like leaf, and the largest ones."""
    count = total = 0
    by_dtype: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    largest: list[tuple[int, str, Any]] = []
    nodes = 0
    for path, leaf in walk(obj):
        nodes += 1
        info = leaf_info(leaf)
        assert info is not None
        count += 1
        total += info.nbytes
        by_dtype[info.dtype][0] += 1
        by_dtype[info.dtype][1] += info.nbytes
        largest.append((info.nbytes, path, info))
        if len(largest) > 4 * max_listed:
            largest = sorted(largest, key=lambda x: -x[0])[:max_listed]
    largest = sorted(largest, key=lambda x: -x[0])[:max_listed]
    return TensorSummary(
        count=count,
        total_bytes=total,
        dtypes=[
            DTypeCount(dtype=d, count=c, bytes=b)
            for d, (c, b) in sorted(by_dtype.items(), key=lambda x: -x[1][1])
        ],
        largest=[TensorInfo(name=p, shape=list(i.shape), dtype=i.dtype, bytes=n) for n, p, i in largest],
        truncated=nodes >= MAX_NODES,
    )


def _mapping_range(path: Path) -> list[tuple[int, int]]:
    """Address ranges of `path` mapped into this process (from /proc/self/maps)."""
    target = str(path.resolve())
    ranges = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].strip() == target:
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    ranges.append((lo, hi))
    except OSError:
        return []
    return ranges


def _releaser(mapped_file: Path | None) -> Callable[[torch.Tensor], None]:
    if mapped_file is None:
        return lambda piece: None
    ranges = _mapping_range(mapped_file)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return lambda piece: None
    page = mmap.PAGESIZE

    def release(piece: torch.Tensor) -> None:
        start = piece.data_ptr()
        end = start + piece.numel() * piece.element_size()
        lo, hi = start - start % page, -(-end // page) * page
        if any(a <= lo and hi <= b for a, b in ranges):  # only inside the file mapping, never the heap
            libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED)

    return release


def _is_float_leaf(leaf: Any) -> bool:
    if isinstance(leaf, torch.Tensor):
        return leaf.is_floating_point() or leaf.is_complex()
    if isinstance(leaf, TensorMeta):
        return leaf.dtype.startswith(("float", "bfloat", "complex"))
    info = leaf_info(leaf)
    return info is not None and info.kind == "numpy" and leaf.dtype.kind in "fc"


def _pieces(leaf: Any, max_elems: int) -> Iterator[torch.Tensor]:
    """1-D pieces of a leaf's values, each at most max_elems long."""
    if isinstance(leaf, TensorMeta):
        if leaf.chunks is not None:
            yield from leaf.chunks(max_elems)
        return
    tensor = leaf if isinstance(leaf, torch.Tensor) else torch.from_numpy(leaf)
    if tensor.layout != torch.strided or tensor.device.type == "meta":
        return  # sparse/meta tensors: no dense values to read here
    tensor = tensor.detach()
    if tensor.dim() == 0:
        yield tensor.reshape(1)
        return
    if tensor.is_contiguous():
        flat = tensor.reshape(-1)  # (numel,) view, no copy
        for start in range(0, flat.numel(), max_elems):
            yield flat[start : start + max_elems]
        return
    for row in tensor.unbind(0):  # non-contiguous: one slice along dim 0 at a time
        yield from _pieces(row, max_elems)


def _count(piece: torch.Tensor) -> tuple[int, int]:
    if piece.is_complex():
        piece = torch.view_as_real(piece)
    if piece.dtype not in _NATIVE_FLOATS:
        piece = piece.float()  # float8 and friends: upcast one piece at a time
    if bool(torch.isfinite(piece).all()):
        return 0, 0
    return int(torch.isnan(piece).sum()), int(torch.isinf(piece).sum())


SMALL_ELEMENTS = 1 << 12


@functools.cache
def _itemsize(dtype_name: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype_name)).element_size()


# tensors up to this size are checked together, many per torch call


def find_nonfinite(
    obj: Any,
    mapped_file: Path | None = None,
    max_listed: int = 50,
    chunk_elements: int = CHUNK_ELEMENTS,
    progress: Callable[[int, str], None] | None = None,
) -> list[NonfiniteTensor]:
    """Every floating tensor holding NaN or Inf, with counts (at most max_listed reported).

    Small tensors are batched: their pieces are concatenated per dtype and checked with one
    isfinite; only a batch that holds a NaN/Inf is counted tensor by tensor, so a checkpoint of
    half a million tiny tensors costs a few hundred torch calls, not millions.
    """
    release = _releaser(mapped_file)
    found: list[NonfiniteTensor] = []
    batches: dict[torch.dtype, list[tuple[str, Any, list[torch.Tensor]]]] = defaultdict(list)
    batch_sizes: dict[torch.dtype, int] = defaultdict(int)

    def report(path: str, leaf: Any, nan: int, inf: int) -> None:
        if not (nan or inf) or len(found) >= max_listed:
            return
        info = leaf_info(leaf)
        assert info is not None
        numel = 1
        for d in info.shape:
            numel *= d
        found.append(
            NonfiniteTensor(
                name=path, dtype=info.dtype, shape=list(info.shape), numel=numel, nan=nan, inf=inf
            )
        )

    def flush(dtype: torch.dtype) -> None:
        batch = batches.pop(dtype, [])
        batch_sizes.pop(dtype, None)
        if not batch:
            return
        joined = torch.cat([p for _, _, pieces in batch for p in pieces])
        if _count(joined) == (0, 0):
            return
        for path, leaf, pieces in batch:
            counts = [_count(p) for p in pieces]
            report(path, leaf, sum(c[0] for c in counts), sum(c[1] for c in counts))

    # runs of small file-backed tensors (safetensors): one read and one check per run
    runs: dict[tuple[int, str], list] = {}  # (reader id, dtype) -> [reader, start, end, [(path, leaf)]]

    def flush_run(key: tuple[int, str]) -> None:
        run = runs.pop(key, None)
        if run is None:
            return
        reader, start, end, members = run
        dtype = getattr(torch, key[1])
        values = torch.frombuffer(bytearray(reader.span(start, end - start)), dtype=dtype)
        if _count(values) == (0, 0):
            return
        for path, leaf in members:  # something in the run (maybe a gap's bytes) is not finite: count exactly
            counts = [_count(p) for p in _pieces(leaf, chunk_elements)]
            report(path, leaf, sum(c[0] for c in counts), sum(c[1] for c in counts))

    for index, (path, leaf) in enumerate(walk(obj)):
        if not _is_float_leaf(leaf):
            continue
        if isinstance(leaf, TensorMeta) and leaf.location is not None and leaf.nbytes <= SMALL_ELEMENTS * 8:
            reader, offset, nbytes = leaf.location
            key = (id(reader), leaf.dtype)
            size = _itemsize(leaf.dtype)
            run = runs.get(key)
            if run is not None:
                gap = offset - run[2]
                if (
                    gap < 0
                    or gap > 4096
                    or (offset - run[1]) % size
                    or run[2] - run[1] > chunk_elements * size
                ):
                    flush_run(key)
                    run = None
            if run is None:
                runs[key] = run = [reader, offset, offset, []]
            run[2] = offset + nbytes
            run[3].append((path, leaf))
            continue
        if progress is not None and index % 64 == 0:
            progress(index, path)
        info = leaf_info(leaf)
        numel = 1
        for d in info.shape if info is not None else ():
            numel *= d
        if numel <= SMALL_ELEMENTS:
            pieces = [p.reshape(-1) for p in _pieces(leaf, chunk_elements)]
            if pieces:
                dtype = pieces[0].dtype
                batches[dtype].append((path, leaf, pieces))
                batch_sizes[dtype] += numel
                if batch_sizes[dtype] >= chunk_elements:
                    flush(dtype)
            continue
        nan = inf = 0
        for piece in _pieces(leaf, chunk_elements):
            n, i = _count(piece)
            nan += n
            inf += i
            release(piece)
        report(path, leaf, nan, inf)
    for dtype in list(batches):
        flush(dtype)
    for key in list(runs):
        flush_run(key)
    return found
