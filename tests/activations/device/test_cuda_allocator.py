"""The CUDA caching allocator model against cases worked by hand from CUDACachingAllocator.cpp, and against a history
CUDA itself recorded on an H200."""

from __future__ import annotations

import pytest

from memlayout.activations.device.cuda_allocator import (
    FREE,
    CachingAllocator,
    replay,
    round_size,
    segment_size,
)
from memlayout.errors import AllocatorOutOfMemoryError
from tests.activations.allocator_history import (
    H200_MEASURED,
    History,
    history,
    load_snapshot,
    replay_cold,
    replay_from_start,
)

KiB, MiB = 1 << 10, 1 << 20


def test_requests_round_up_to_512_bytes_and_zero_allocates_nothing() -> None:
    allocator = CachingAllocator()
    assert allocator.malloc(0) is None
    assert (allocator.allocated, allocator.reserved) == (0, 0)
    allocator.malloc(100)
    allocator.malloc(513)
    assert allocator.allocated == 512 + 1024
    assert [round_size(n) for n in (1, 512, 513, 1000)] == [512, 512, 1024, 1024]


def test_three_600_kib_requests_share_one_2_mib_small_segment_and_a_fourth_opens_another() -> None:
    allocator = CachingAllocator()
    addresses = [allocator.malloc(600 * KiB) for _ in range(3)]
    assert allocator.reserved == 2 * MiB and len(allocator.segments) == 1
    assert addresses == [addresses[0] + i * 600 * KiB for i in range(3)]  # front of the block, rest behind
    assert allocator.allocated == 3 * 600 * KiB
    allocator.malloc(600 * KiB)  # 248 KiB are left in the first segment
    assert allocator.reserved == 4 * MiB


def test_one_mib_is_still_small_and_one_byte_more_is_large() -> None:
    assert segment_size(round_size(MiB)) == 2 * MiB
    assert segment_size(round_size(MiB + 1)) == 20 * MiB
    allocator = CachingAllocator()
    allocator.free(allocator.malloc(512 * KiB))
    allocator.malloc(2 * MiB)  # the free small block never serves the large pool
    assert allocator.reserved == 22 * MiB


def test_a_3_mib_request_gets_a_20_mib_segment_that_later_requests_share() -> None:
    allocator = CachingAllocator()
    first = allocator.malloc(3 * MiB)
    assert allocator.reserved == 20 * MiB and allocator.allocated == 3 * MiB
    second = allocator.malloc(12 * MiB)  # fits the 17 MiB left: no new segment
    assert second == first + 3 * MiB
    assert allocator.reserved == 20 * MiB


def test_a_12_mib_request_gets_a_segment_of_its_own_rounded_to_2_mib() -> None:
    allocator = CachingAllocator()
    allocator.malloc(12 * MiB)
    assert allocator.reserved == 12 * MiB
    allocator.malloc(12 * MiB + 1)
    assert allocator.reserved == 12 * MiB + 14 * MiB


def test_a_large_block_keeps_a_rest_of_1_mib_or_less_and_counts_it_as_allocated() -> None:
    allocator = CachingAllocator()
    allocator.malloc(13 * MiB)  # 14 MiB segment, 1 MiB rest: not split (more than kSmallSize is needed)
    assert allocator.allocated == 14 * MiB
    allocator.malloc(12 * MiB + 512 * KiB)  # 14 MiB segment, 1.5 MiB rest: split
    assert allocator.allocated == 14 * MiB + 12 * MiB + 512 * KiB
    assert allocator.reserved == 28 * MiB


def test_best_fit_takes_the_smallest_free_block_that_holds_the_request() -> None:
    allocator = CachingAllocator()
    twelve, sixteen = allocator.malloc(12 * MiB), allocator.malloc(16 * MiB)
    allocator.free(sixteen)
    allocator.free(twelve)
    assert allocator.malloc(11 * MiB) == twelve
    assert allocator.malloc(13 * MiB) == sixteen
    assert allocator.reserved == 28 * MiB


def test_freed_neighbours_coalesce_into_one_block() -> None:
    allocator = CachingAllocator()
    a, b, c = (allocator.malloc(3 * MiB) for _ in range(3))
    allocator.free(a)
    allocator.free(b)
    # a and b are one 6 MiB block now: best fit takes it before the 11 MiB behind c.
    merged = allocator.malloc(5 * MiB)
    assert merged == a and allocator.block_size(merged) == 6 * MiB
    allocator.free(merged)
    allocator.free(c)
    assert allocator.block_size(a) == 20 * MiB
    allocator.release_cached()
    assert allocator.reserved == 0


def test_segments_stay_reserved_when_freed_and_serve_smaller_requests() -> None:
    peaks = replay([(0, 50 * MiB), (0, FREE), (1, 30 * MiB), (2, 20 * MiB)])
    assert peaks.reserved_bytes == 50 * MiB and peaks.segments == 1
    assert peaks.allocated_bytes == 50 * MiB


def test_out_of_memory_releases_the_free_segments_and_tries_again() -> None:
    allocator = CachingAllocator(capacity=60 * MiB)
    allocator.free(allocator.malloc(50 * MiB))
    allocator.malloc(60 * MiB)  # 50 + 60 do not fit: the cached 50 MiB goes back to the driver
    assert allocator.reserved == 60 * MiB and allocator.peak_reserved == 60 * MiB
    with pytest.raises(AllocatorOutOfMemoryError):
        allocator.malloc(1)


def test_a_split_segment_is_not_released() -> None:
    allocator = CachingAllocator(capacity=40 * MiB)
    keep = allocator.malloc(3 * MiB)
    allocator.free(allocator.malloc(12 * MiB))
    assert keep is not None and allocator.reserved == 20 * MiB
    with pytest.raises(AllocatorOutOfMemoryError):
        allocator.malloc(22 * MiB)


# What CUDA wrote -------------------------------------------------------------------------------------------------
# The second AdamW step of a 1.1B Llama under bf16 autocast on an H200, torch 2.11.0+cu130: 2,451 allocations,
# 2,451 frees and 6 new segments (see tests/activations/allocator_history.py and docs/gpu.md).


@pytest.fixture(scope="module")
def h200_history() -> History:
    return history(load_snapshot())


def test_the_h200_step_replayed_from_its_start_puts_every_block_where_cuda_did(h200_history: History) -> None:
    replayed = replay_from_start(h200_history)
    assert replayed.allocated_at_start == H200_MEASURED["allocated_before_step"]
    assert replayed.reserved_at_start == H200_MEASURED["reserved_before_step"]
    assert replayed.placements == 2451
    assert replayed.misplaced == 0
    # The model asked the driver for the segments CUDA's trace shows, in the same order and of the same sizes.
    assert replayed.new_segments == h200_history.new_segments
    assert replayed.peaks.allocated_bytes == H200_MEASURED["max_memory_allocated"]
    assert replayed.peaks.reserved_bytes == H200_MEASURED["max_memory_reserved"]


def test_the_h200_step_replayed_from_nothing_predicts_its_peaks(h200_history: History) -> None:
    """As a prediction starts: nothing reserved, the model state allocated first, the step twice. Measured here:
    allocated to the byte, reserved 1.028x (27,476,885,504 against 26,730,299,392 bytes)."""
    peaks = replay_cold(h200_history, steps=2)
    allocated = peaks.allocated_bytes / H200_MEASURED["max_memory_allocated"]
    reserved = peaks.reserved_bytes / H200_MEASURED["max_memory_reserved"]
    assert abs(allocated - 1) <= 0.02
    assert abs(reserved - 1) <= 0.05


def test_the_docstring_examples_run() -> None:
    import doctest

    from memlayout.activations.device import cuda_allocator

    result = doctest.testmod(cuda_allocator)
    assert result.attempted and not result.failed


def test_a_block_freed_on_one_stream_serves_only_that_streams_requests() -> None:
    # get_free_block looks up (stream, size): the all-gather stream's freed 20 MiB segment is no use to the default
    # stream, which opens one of its own, and serves the all-gather stream's next request again.
    allocator = CachingAllocator()
    gathered = allocator.malloc(3 * MiB, stream=1)
    allocator.free(gathered)
    allocator.malloc(3 * MiB)
    assert allocator.reserved == 40 * MiB
    assert allocator.malloc(3 * MiB, stream=1) == gathered
    assert allocator.reserved == 40 * MiB


def test_streams_replay_as_events_with_a_third_item() -> None:
    one_stream = replay([(0, 12 * MiB), (0, FREE), (1, 12 * MiB)])
    two_streams = replay([(0, 12 * MiB, 2), (0, FREE, 2), (1, 12 * MiB, 0)])
    assert one_stream.reserved_bytes == 12 * MiB
    assert two_streams.reserved_bytes == 24 * MiB and two_streams.allocated_bytes == 12 * MiB


def test_release_on_a_full_device_frees_the_cached_segments_of_every_stream() -> None:
    allocator = CachingAllocator(capacity=30 * MiB)
    allocator.free(allocator.malloc(12 * MiB, stream=1))
    allocator.malloc(20 * MiB)  # 12 + 20 > 30: stream 1's free segment is released first
    assert allocator.reserved == 20 * MiB


def test_the_reserved_peak_says_what_each_stream_held_at_it() -> None:
    peaks = replay([(0, 12 * MiB, 0), (1, 40 * MiB, 3), (1, FREE, 3), (2, 4 * MiB, 1)])
    assert peaks.reserved_bytes == 72 * MiB
    assert peaks.reserved_by_stream == ((0, 12 * MiB), (1, 20 * MiB), (3, 40 * MiB))
