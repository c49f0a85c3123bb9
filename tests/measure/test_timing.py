"""Timing: a run's events time the kernel, not the host's launch of it."""

import time

import pytest
import torch

from gemmtune.measure.timing import HOLD_CYCLES_PER_US, HOLD_MARGIN_US, LaunchHold, time_cuda


def test_the_hold_outlasts_the_hosts_launch():
    assert LaunchHold(0.015).cycles == int((15 + HOLD_MARGIN_US) * HOLD_CYCLES_PER_US)
    assert LaunchHold(0.0).cycles > 0  # the flush and the events take host time too
    assert LaunchHold(50.0).cycles == 1000 * HOLD_CYCLES_PER_US  # a slow call is not waited out


@pytest.mark.gpu
def test_a_slow_launch_is_not_timed_as_kernel_time():
    """A call that spends 60 µs on the host before its kernel times as the kernel alone: the
    events would otherwise hold the host's 60 µs (its kernel takes a few µs)."""
    x = torch.randn(1 << 16, device="cuda")

    def kernel():
        torch.mul(x, 2.0, out=x)

    def slow_launch():
        deadline = time.perf_counter() + 60e-6
        while time.perf_counter() < deadline:
            pass
        kernel()

    fast = time_cuda(kernel, runs=200).median_ms
    slow = time_cuda(slow_launch, runs=200).median_ms
    assert slow < fast + 0.010, (fast, slow)


@pytest.mark.gpu
def test_rotated_windows_start_each_round_at_another_function():
    """With `rotate`, round r's first window is the r-th function's: none always follows the
    same one. Each function records when its window's warm-up first calls it."""
    from gemmtune.measure.timing import time_in_windows

    x = torch.randn(1 << 12, device="cuda")
    calls: list[int] = []

    def contender(index: int):
        def run():
            if not calls or calls[-1] != index:
                calls.append(index)
            torch.mul(x, 1.0, out=x)

        return run

    time_in_windows([contender(i) for i in range(3)], window_ms=0.5, rounds=3, rotate=True)
    assert calls == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    calls.clear()
    time_in_windows([contender(i) for i in range(3)], window_ms=0.5, rounds=2)
    assert calls == [0, 1, 2, 0, 1, 2]
