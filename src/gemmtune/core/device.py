"""Which GPU a tensor lives on, and what our kernels need to know about it.

Everything here is cached per device index: the properties of a GPU do not change while a
process runs, and `GemmProblem.from_tensors` sits on the dispatch hot path.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from gemmtune.core.files import write_atomically
from gemmtune.core.settings import cache_dir

log = logging.getLogger(__name__)


class Arch(str, enum.Enum):
    """The GPU architectures gemmtune knows, and everything else."""

    SM90 = "sm_90"
    SM100 = "sm_100"
    OTHER = "other"

    @property
    def compile_target(self) -> str:
        """The DSL target (`CUTE_DSL_ARCH`) that kernels for this architecture compile to."""
        if self is Arch.OTHER:
            raise ValueError("no gemmtune kernel targets this architecture")
        return self.value + "a"

    @property
    def has_kernels(self) -> bool:
        """Whether gemmtune has a kernel for this architecture (`kernels.build.KERNEL_MODULES`)."""
        return self in (Arch.SM90, Arch.SM100)

    @property
    def verified_on_hardware(self) -> bool:
        """Whether its kernel has run on this architecture's GPUs. The Blackwell kernel has only
        been compiled (no B200 was at hand): it serves a bucket only where a tune verified it
        on the GPU, never as the ranking model's untested first choice."""
        return self is Arch.SM90

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


FACTS_FILE = "device-facts.json"


@functools.cache
def max_active_clusters(cluster_size: int, device_index: int) -> int:
    """How many clusters of `cluster_size` CTAs (each using all of an SM's shared memory) run
    at once on the GPU: 132, 66, 30, 15 for 1, 2, 4, 8 on an H100/H200.

    The driver answers only for a loaded kernel (`_query_max_active_clusters` loads an empty
    one); the answer is kept in the cache directory, keyed by the GPU's name and SM count.
    """
    info = device_info(device_index)
    key = f"{info.name}|{info.sm_count}|{cluster_size}"
    path = cache_dir() / FACTS_FILE
    facts = _read_facts(path)
    if key not in facts:
        facts[key] = _query_max_active_clusters(cluster_size, device_index)
        _add_fact(path, key, facts[key])
    return int(facts[key])


#: An empty kernel for the occupancy query. PTX for sm_90 is compiled by the driver for any
#: later GPU too; the query depends on the launch's shared memory and cluster, not the code.
_PROBE_PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry gemmtune_probe() { ret; }
"""


def _driver(result: tuple) -> object:
    """The value of a cuda-python driver call, or RuntimeError on a CUDA error."""
    import cuda.bindings.driver as driver

    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {result[0]!r}")
    return result[1] if len(result) == 2 else result[1:]


def _query_max_active_clusters(cluster_size: int, device_index: int) -> int:
    """Ask the driver's occupancy calculator, for an empty kernel given all the shared
    memory a block may have, as our kernels take. No compiler: the driver loads PTX itself,
    in milliseconds (the DSL's own helper compiles a kernel, importing the DSL: seconds)."""
    import cuda.bindings.driver as driver

    with torch.cuda.device(device_index):
        torch.cuda.current_stream().synchronize()  # torch's context, current on this thread
        module = _driver(driver.cuModuleLoadData(_PROBE_PTX))
        try:
            function = _driver(driver.cuModuleGetFunction(module, b"gemmtune_probe"))
            device = _driver(driver.cuCtxGetDevice())
            attribute = driver.CUdevice_attribute
            smem = _driver(
                driver.cuDeviceGetAttribute(
                    attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device
                )
            )
            func = driver.CUfunction_attribute
            _driver(
                driver.cuFuncSetAttribute(
                    function, func.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem
                )
            )
            _driver(
                driver.cuFuncSetAttribute(
                    function, func.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1
                )
            )
            cluster = driver.CUlaunchAttribute()
            cluster.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            value = driver.CUlaunchAttributeValue()
            value.clusterDim.x, value.clusterDim.y, value.clusterDim.z = cluster_size, 1, 1
            cluster.value = value
            config = driver.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = cluster_size, 1, 1
            config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
            config.sharedMemBytes = smem
            config.attrs = [cluster]
            config.numAttrs = 1
            return int(_driver(driver.cuOccupancyMaxActiveClusters(function, config)))
        finally:
            driver.cuModuleUnload(module)


def _read_facts(path: Path) -> dict:
    try:
        facts = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s (%s)", path, exc)
        return {}
    return facts if isinstance(facts, dict) else {}


def _add_fact(path: Path, key: str, value: int) -> None:
    """Add one fact to the file, merged under its lock with what other processes wrote."""

    def write(temporary: Path) -> None:
        facts = {**_read_facts(path), key: value}
        temporary.write_text(json.dumps(facts, indent=1, sort_keys=True))

    try:
        write_atomically(path, write)
    except OSError as exc:  # a read-only cache costs a query per process, nothing more
        log.warning("cannot write %s (%s)", path, exc)
