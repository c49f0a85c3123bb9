"""Which GPU a tensor lives on, and what our kernels need to know about it.

Everything here is cached per device index: the properties of a GPU do not change while a
process runs, and `GemmProblem.from_tensors` sits on the dispatch hot path.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch


class Arch(str, enum.Enum):
    """The GPU architectures gemmtune has kernels for, and everything else."""

    SM90 = "sm_90"
    SM100 = "sm_100"
    OTHER = "other"

    @property
    def compile_target(self) -> str:
        """The DSL target (`CUTE_DSL_ARCH`) that kernels for this architecture compile to."""
        if self is Arch.OTHER:
            raise ValueError("no gemmtune kernel targets this architecture")
        return self.value + "a"

    @classmethod
    def from_capability(cls, major: int, minor: int) -> Arch:
        # sm_90a and sm_100a code runs only on exactly these parts: a 10.3 (B300) or 12.x
        # (consumer Blackwell) GPU cannot execute sm_100a instructions such as tcgen05.
        if (major, minor) == (9, 0):
            return cls.SM90
        if (major, minor) == (10, 0):
            return cls.SM100
        return cls.OTHER


@dataclass(frozen=True)
class DeviceInfo:
    """What the tuner and the kernels need to know about one GPU."""

    index: int
    name: str
    capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    memory_bytes: int

    @property
    def arch(self) -> Arch:
        return Arch.from_capability(*self.capability)

    @property
    def sm_label(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


@functools.cache
def device_info(index: int) -> DeviceInfo:
    """Properties of CUDA device `index` (cached; raises if no such device)."""
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(
        index=index,
        name=props.name,
        capability=(props.major, props.minor),
        sm_count=props.multi_processor_count,
        l2_bytes=getattr(props, "L2_cache_size", 0),
        memory_bytes=props.total_memory,
    )


@functools.cache
def arch_of(index: int) -> Arch:
    """The architecture of CUDA device `index`."""
    return device_info(index).arch


def gpu_available() -> bool:
    """True when torch sees at least one CUDA device."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0
