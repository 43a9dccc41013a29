"""The CUDA caching-allocator model: rounding, pools, segment sizes, splitting, merging, releasing."""

from __future__ import annotations

from torch_skills.memory.allocator import CachingAllocatorModel, round_size, segment_size

MiB = 2**20


def test_requests_are_rounded_up_to_512_bytes():
    """round_size: 1 B and 512 B take 512, 513 B takes 1024, exact multiples stay as they are."""
    assert [round_size(n) for n in (1, 511, 512, 513, 4096, 4097)] == [512, 512, 512, 1024, 4096, 4608]


def test_segment_sizes_follow_the_three_size_classes():
    """<= 1 MiB: 2 MiB segments; 1-10 MiB: 20 MiB segments; >= 10 MiB: rounded up to 2 MiB."""
    assert segment_size(512) == segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(11 * MiB + 512) == 12 * MiB


def test_small_allocations_pack_into_one_2_mib_segment():
    """Four 500 KB tensors share a 2 MiB segment: allocated counts their rounded sizes, reserved one segment."""
    sim = CachingAllocatorModel()
    for i in range(4):
        assert sim.malloc(i, 500_000) == 500_224  # 977 blocks of 512 B
    assert sim.allocated == 4 * 500_224
    assert sim.reserved == 2 * MiB
    sim.malloc("fifth", 500_000)
    assert sim.reserved == 4 * MiB


def test_a_large_block_is_not_split_when_the_remainder_is_at_most_1_mib():
    """An 11.5 MiB request gets a 12 MiB segment whole (0.5 MiB remainder is not split off) and counts 12 MiB."""
    sim = CachingAllocatorModel()
    assert sim.malloc("a", 11 * MiB + MiB // 2) == 12 * MiB
    assert sim.allocated == sim.reserved == 12 * MiB


def test_a_medium_request_splits_a_20_mib_segment_and_the_rest_is_reused():
    """A 3 MiB request splits a 20 MiB segment; a later 15 MiB request fits in the 17 MiB remainder."""
    sim = CachingAllocatorModel()
    assert sim.malloc("a", 3 * MiB) == 3 * MiB
    assert sim.malloc("b", 15 * MiB) == 15 * MiB
    assert sim.reserved == 20 * MiB


def test_freed_neighbours_merge_so_a_large_request_reuses_the_segment():
    """Freeing two adjacent 10 MiB blocks of a 20 MiB segment leaves one 20 MiB block for a 20 MiB request."""
    sim = CachingAllocatorModel()
    sim.malloc("big", 20 * MiB)
    sim.free("big")
    sim.malloc("a", 10 * MiB)
    sim.malloc("b", 10 * MiB)
    assert sim.reserved == 20 * MiB
    sim.free("a")
    sim.free("b")
    sim.malloc("c", 20 * MiB)
    assert sim.reserved == 20 * MiB
    assert sim.peak_allocated == 20 * MiB


def test_best_fit_takes_the_smallest_cached_block_that_fits():
    """With 30 MiB and 12 MiB cached, a 12 MiB request takes the 12 MiB block and leaves 30 MiB whole."""
    sim = CachingAllocatorModel()
    sim.malloc("x", 30 * MiB)
    sim.malloc("y", 12 * MiB)
    sim.free("x")
    sim.free("y")
    sim.malloc("z", 12 * MiB)
    sim.malloc("w", 30 * MiB)
    assert sim.reserved == 42 * MiB


def test_cached_segments_are_released_before_running_out_of_capacity():
    """At a 40 MiB capacity a cached 30 MiB segment too small for 35 MiB is released first; 50 MiB more is OOM."""
    sim = CachingAllocatorModel(capacity_bytes=40 * MiB)
    sim.malloc("x", 30 * MiB)
    sim.free("x")
    sim.malloc("y", 35 * MiB)
    assert not sim.oom and sim.reserved == 36 * MiB  # 35 MiB rounded up to 2 MiB; the 30 MiB segment is gone
    sim.malloc("z", 50 * MiB)
    assert sim.oom


def test_zero_byte_tensors_take_no_block():
    """Empty tensors allocate nothing in the CUDA allocator."""
    sim = CachingAllocatorModel()
    assert sim.malloc("empty", 0) == 0
    assert sim.allocated == sim.reserved == 0
