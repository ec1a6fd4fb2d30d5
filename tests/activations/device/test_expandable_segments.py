"""The allocator model with expandable segments, against cases worked by hand from CUDACachingAllocator.cpp.

`try_allocate_expandable_block` maps pages (2 MiB small, 20 MiB large) at the end of the
pool's segment for the stream, growing a free block that ends where the mapping ends;
`should_split` splits any rest of 512 bytes or more; nothing is unmapped during a step.
"""

from __future__ import annotations

from memlayout.activations.device.cuda_allocator import FREE, replay
from memlayout.activations.device.expandable_segments import ExpandableAllocator, allocator_config

MiB = 1 << 20


def test_a_large_request_maps_20_mib_pages_and_the_rest_serves_the_next() -> None:
    allocator = ExpandableAllocator()
    first = allocator.malloc(30 * MiB)
    assert (allocator.reserved, allocator.allocated) == (40 * MiB, 30 * MiB)
    second = allocator.malloc(8 * MiB)  # the 10 MiB rest was split off, and serves it
    assert second == first + 30 * MiB and allocator.reserved == 40 * MiB


def test_a_request_larger_than_the_free_end_grows_it_by_what_is_missing() -> None:
    allocator = ExpandableAllocator()
    allocator.malloc(30 * MiB)  # 40 mapped, 10 free at the end
    allocator.malloc(15 * MiB)  # 5 missing: one more 20 MiB page, the block starts in the free 10
    assert allocator.reserved == 60 * MiB
    # The default allocator gives each request from 10 MiB a segment of its own, rounded to 2 MiB: 30 + 16.
    default = replay([(0, 30 * MiB), (1, 15 * MiB)])
    assert default.reserved_bytes == 30 * MiB + 16 * MiB


def test_a_freed_hole_serves_only_what_fits_it_and_stays_mapped() -> None:
    peaks = replay([(0, 40 * MiB), (1, 40 * MiB), (0, FREE), (2, 60 * MiB), (3, 30 * MiB)], allocator=ExpandableAllocator())
    # 0 and 1 map 80 MiB; 0's 40 MiB hole cannot take 60 MiB (mapped at the end: 140), then takes the 30.
    assert peaks.reserved_bytes == 140 * MiB and peaks.allocated_bytes == 130 * MiB


def test_each_stream_and_pool_grows_a_segment_of_its_own() -> None:
    peaks = replay([(0, 30 * MiB, 0), (1, 30 * MiB, 1), (2, 100_000, 0)], allocator=ExpandableAllocator())
    assert peaks.reserved_by_stream == ((0, 40 * MiB + 2 * MiB), (1, 40 * MiB))


def test_on_a_full_device_the_free_end_is_unmapped_first() -> None:
    allocator = ExpandableAllocator(capacity=60 * MiB)
    allocator.free(allocator.malloc(30 * MiB, stream=1))  # stream 1 maps 40 MiB, all free again
    allocator.malloc(30 * MiB)  # 40 more do not fit 60: stream 1's free 40 are unmapped first
    assert allocator.reserved == 40 * MiB


def test_the_setting_is_read_as_pytorch_cuda_alloc_conf_writes_it() -> None:
    assert allocator_config({}).expandable_segments is False
    config = allocator_config({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128, expandable_segments:True"})
    assert config.expandable_segments and config.unmodelled == ("max_split_size_mb:128",)
    assert not allocator_config({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}).expandable_segments
