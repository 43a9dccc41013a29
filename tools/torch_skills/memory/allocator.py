"""A model of PyTorch's CUDA caching allocator, replayed over a sequence of allocations and frees.

Use:

    sim = CachingAllocatorModel(capacity_bytes=80 * 2**30)   # capacity optional
    block = sim.malloc("a", 3_000_000)     # -> bytes handed out (what memory_allocated() counts)
    sim.free("a")
    sim.allocated, sim.reserved, sim.peak_allocated, sim.peak_reserved, sim.oom

It follows `DeviceCachingAllocator` in c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch, read
for this tool at commit 001074d2) with the default settings (no PYTORCH_CUDA_ALLOC_CONF): one
stream, no expandable segments, no max_split_size, no garbage-collection threshold.

- every request is rounded up to a multiple of 512 B (`kMinBlockSize`, `round_size`);
- requests of at most 1 MiB (`kSmallSize`) come from the small pool, whose segments are 2 MiB
  (`kSmallBuffer`); larger ones from the large pool, whose segments are 20 MiB (`kLargeBuffer`)
  for requests under 10 MiB (`kMinLargeAlloc`), else the request rounded up to 2 MiB
  (`kRoundLarge`) (`get_allocation_size`);
- a request takes the smallest cached free block that fits (best fit, ties to the lower address,
  `get_free_block`), else a new segment (`alloc_block`, i.e. cudaMalloc);
- the block is split when the remainder is >= 512 B in the small pool or > 1 MiB in the large
  pool (`should_split`); otherwise the whole block is handed out and counted as allocated;
- a freed block merges with free neighbours of its segment (`free_block`); segments stay
  reserved until empty_cache, except that when a new segment would not fit in the capacity,
  every wholly free segment is released and the allocation retried (`release_cached_blocks`).

Known limitations: allocations on other streams, CUDA graphs, `expandable_segments:True` and
`max_split_size_mb` are not modelled; neither is memory outside the allocator (the CUDA context,
NCCL buffers).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1048576  # kSmallSize: the largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2097152  # kSmallBuffer: small allocations are packed in 2 MiB segments
K_LARGE_BUFFER = 20971520  # kLargeBuffer: 1-10 MiB allocations may be packed in 20 MiB segments
K_MIN_LARGE_ALLOC = 10485760  # kMinLargeAlloc: allocations under 10 MiB may use kLargeBuffer
K_ROUND_LARGE = 2097152  # kRoundLarge: larger allocations are rounded up to 2 MiB


def round_size(nbytes: int) -> int:
    """Bytes the allocator asks its pools for: at least 512, a multiple of 512."""
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((nbytes + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def segment_size(rounded: int) -> int:
    """Size of the cudaMalloc made when no cached block fits a request of `rounded` bytes."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((rounded + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


@dataclass(eq=False)
class _Block:
    address: int
    size: int
    small: bool
    segment: int
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None


@dataclass
class _Pool:
    """Free blocks of one pool, sorted by (size, address) like the allocator's std::set."""

    keys: list[tuple[int, int]] = field(default_factory=list)
    blocks: dict[tuple[int, int], _Block] = field(default_factory=dict)

    def insert(self, block: _Block) -> None:
        key = (block.size, block.address)
        bisect.insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = (block.size, block.address)
        i = bisect.bisect_left(self.keys, key)
        del self.keys[i]
        del self.blocks[key]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.keys, (size, -1))
        return self.blocks[self.keys[i]] if i < len(self.keys) else None


class CachingAllocatorModel:
    """Replays malloc/free like the CUDA caching allocator; see the module docstring."""

    def __init__(self, capacity_bytes: int | None = None):
        self.capacity = capacity_bytes
        self.small, self.large = _Pool(), _Pool()
        self.segments: dict[int, int] = {}  # segment id -> size
        self.live: dict[object, _Block] = {}
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0
        self.oom = False  # a segment did not fit in the capacity even after releasing the cache
        self._next_address = 0
        self._next_segment = 0

    def malloc(self, key: object, nbytes: int) -> int:
        """Allocate `nbytes` under `key`; return the block size counted as allocated (0 for 0 B)."""
        if nbytes <= 0:
            return 0
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        pool = self.small if small else self.large
        block = pool.best_fit(size)
        if block is not None:
            pool.remove(block)
        else:
            block = self._new_segment(size, small)
        remaining = block.size - size
        split = remaining >= K_MIN_BLOCK_SIZE if small else remaining > K_SMALL_SIZE
        if split:
            rest = _Block(block.address + size, remaining, small, block.segment, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.insert(rest)
        block.allocated = True
        self.live[key] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block.size

    def free(self, key: object) -> None:
        block = self.live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        block.allocated = False
        pool = self.small if block.small else self.large
        for neighbour in (block.prev, block.next):
            if neighbour is None or neighbour.allocated:
                continue
            pool.remove(neighbour)
            if neighbour is block.prev:
                block.address = neighbour.address
                block.prev = neighbour.prev
                if block.prev is not None:
                    block.prev.next = block
            else:
                block.next = neighbour.next
                if block.next is not None:
                    block.next.prev = block
            block.size += neighbour.size
        pool.insert(block)

    def _new_segment(self, size: int, small: bool) -> _Block:
        nbytes = segment_size(size)
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            self._release_cached_segments()
            if self.reserved + nbytes > self.capacity:
                self.oom = True
        segment = self._next_segment
        self._next_segment += 1
        block = _Block(self._next_address, nbytes, small, segment)
        self._next_address += nbytes
        self.segments[segment] = nbytes
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _release_cached_segments(self) -> None:
        """Like release_cached_blocks: give back every segment that is one free, unsplit block."""
        for pool in (self.small, self.large):
            for key in list(pool.keys):
                block = pool.blocks[key]
                if block.prev is None and block.next is None:
                    pool.remove(block)
                    self.reserved -= self.segments.pop(block.segment)
