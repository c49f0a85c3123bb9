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
