"""`GemmConfig`: the one description of a kernel variant.

A config is data. Its *compile-time* fields pick a binary (tile, cluster, 2-CTA, schedule,
epilogue, stage depth in K, decomposition, operand swap); its *runtime* fields (split count,
raster order, swizzle) are kernel arguments, so sweeping them costs a launch, never a
compile. `key` names the whole variant, `compile_key` the binary.

Fields are validated on construction against what the hardware allows at all; whether a given
kernel implements a config, and whether it can serve a given problem, is the kernels' business
(`gemmtune.kernels`).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any


class InvalidConfigError(ValueError):
    """A GemmConfig field holds a value no kernel can have."""


class Decomposition(str, enum.Enum):
    """How the MAC iterations (output tile x K-block) are spread over CTAs."""

    DATA_PARALLEL = "data_parallel"
    SPLIT_K = "split_k"
    STREAM_K = "stream_k"


class Schedule(str, enum.Enum):
    """How a CTA's consumer warpgroups share the work (Hopper): both on one tile, or alternating
    tiles so that one's epilogue overlaps the other's mainloop."""

    COOPERATIVE = "cooperative"
    PINGPONG = "pingpong"


class Raster(str, enum.Enum):
    """Which way consecutive tiles walk the output: down M first or along N first."""

    ALONG_M = "along_m"
    ALONG_N = "along_n"


ARCHES = ("sm_90", "sm_100")
SWIZZLES = (1, 2, 4, 8)
# MMA rows: multiples of Hopper's 64-row warpgroup MMA (192 = three warpgroups)
TILE_MS = (64, 128, 192, 256)
MAX_CLUSTER_CTAS = 16  # Hopper and Blackwell allow 16 with the non-portable cluster attribute
MAX_SPLITS = 16
#: Bytes of each A and B row one pipeline stage holds: one 128-byte swizzle atom, or two
STAGE_K_BYTES = (128, 256)
# torch.matmul (cuBLAS) as a tuning candidate: its name where a config key would stand
CUBLAS = "cublas"

_DECOMP_TAGS = {
    Decomposition.DATA_PARALLEL: "dp",
    Decomposition.SPLIT_K: "sk",
    Decomposition.STREAM_K: "streamk",
}
_RASTER_TAGS = {Raster.ALONG_M: "m", Raster.ALONG_N: "n"}
_SCHEDULE_TAGS = {Schedule.COOPERATIVE: "coop", Schedule.PINGPONG: "pp"}


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class GemmConfig:
    """One kernel variant. Frozen and hashable; `to_json`/`from_json` round-trip it."""

    arch: str = "sm_90"
    tile_m: int = 128
    tile_n: int = 128
    cluster_m: int = 1
    cluster_n: int = 1
    two_cta: bool = False
    schedule: Schedule = Schedule.COOPERATIVE
    tma_store: bool = True
    decomposition: Decomposition = Decomposition.DATA_PARALLEL
    # The kernel computes out^T = b^T @ a^T: M and N trade places, so tile, cluster and raster
    # are those of the transposed product (a 256x208 swapped tile covers 208 rows of `out`, a
    # height no 64-row warpgroup MMA has). The binary is the unswapped kernel built for the
    # transposed layouts.
    swap_ab: bool = False
    # Bytes of each A and B row (the K extent) one pipeline stage holds. Wider stages read
    # longer runs of each weight row per load, fewer and larger stages in the same memory.
    stage_k_bytes: int = 128
    # runtime fields: kernel arguments, not part of the binary
    splits: int = 1
    raster: Raster = Raster.ALONG_M
    swizzle: int = 1

    RUNTIME_FIELDS = ("splits", "raster", "swizzle")

    def __post_init__(self) -> None:
        # Accept enum values given as strings (JSON, CLI), and store the enum.
        for name, kind in (
            ("decomposition", Decomposition),
            ("raster", Raster),
            ("schedule", Schedule),
        ):
            value = getattr(self, name)
            if not isinstance(value, kind):
                try:
                    object.__setattr__(self, name, kind(value))
                except ValueError:
                    choices = ", ".join(v.value for v in kind)
                    raise InvalidConfigError(f"{name}={value!r} is not one of: {choices}") from None
        self._validate()

    def _validate(self) -> None:
        def fail(field: str, why: str) -> None:
            raise InvalidConfigError(f"{field}={getattr(self, field)!r}: {why}")

        for name in ("tile_m", "tile_n", "cluster_m", "cluster_n", "stage_k_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                fail(name, "must be an integer")
        for name in ("two_cta", "tma_store", "swap_ab"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "must be a bool")
        if self.arch not in ARCHES:
            fail("arch", f"must be one of {ARCHES}")
        if self.tile_m not in TILE_MS:
            fail("tile_m", f"must be one of {TILE_MS}")
        if self.tile_n % 8 or not 8 <= self.tile_n <= 256:
            fail("tile_n", "must be a multiple of 8 from 8 to 256 (the MMA instruction's N)")
        if self.stage_k_bytes not in STAGE_K_BYTES:
            fail("stage_k_bytes", f"must be one of {STAGE_K_BYTES}")
        for name in ("cluster_m", "cluster_n"):
            if not _is_pow2(getattr(self, name)):
                fail(name, "must be a power of two")
        if self.cluster_m * self.cluster_n > MAX_CLUSTER_CTAS:
            fail("cluster_n", f"cluster_m * cluster_n must be at most {MAX_CLUSTER_CTAS}")
        if self.two_cta:
            if self.arch != "sm_100":
                fail("two_cta", "2-CTA MMA instructions exist on sm_100 only")
            if self.cluster_m % 2:
                fail("cluster_m", "2-CTA instructions need an even cluster_m")
            if self.tile_m not in (128, 256):
                fail("tile_m", "2-CTA instructions need tile_m of 128 or 256")
        elif self.arch == "sm_100" and self.tile_m > 128:
            fail("tile_m", "a 1-CTA sm_100 MMA has M of 64 or 128; 256 needs two_cta")
        if self.schedule is Schedule.PINGPONG and self.arch != "sm_90":
            fail("schedule", "ping-pong warpgroups are a Hopper (sm_90) schedule")
        self._validate_runtime()

    def _validate_runtime(self) -> None:
        def fail(field: str, why: str) -> None:
            raise InvalidConfigError(f"{field}={getattr(self, field)!r}: {why}")

        for name in ("splits", "swizzle"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                fail(name, "must be an integer")
        if self.decomposition is Decomposition.SPLIT_K:
            if not 2 <= self.splits <= MAX_SPLITS:
                fail("splits", f"split-K needs 2 to {MAX_SPLITS} splits")
        elif self.splits != 1:
            fail("splits", f"only split-K takes a split count, not {self.decomposition.value}")
        if self.swizzle not in SWIZZLES:
            fail("swizzle", f"must be one of {SWIZZLES}")

    # -- names -------------------------------------------------------------------------------

    @property
    def cta_group(self) -> int:
        """CTAs that compute one MMA tile together: 2 with 2-CTA instructions, else 1. Each
        holds `tile_m // cta_group` rows of the tile's output."""
        return 2 if self.two_cta else 1

    @property
    def compile_key(self) -> str:
        """Names the binary: every compile-time field, no runtime field."""
        parts = [
            self.arch.replace("_", ""),
            f"{self.tile_m}x{self.tile_n}",
            f"c{self.cluster_m}x{self.cluster_n}",
        ]
        if self.two_cta:
            parts.append("2cta")
        if self.swap_ab:
            parts.append("swap")
        parts.append(_SCHEDULE_TAGS[self.schedule])
        parts.append("tma" if self.tma_store else "st")
        if self.stage_k_bytes != STAGE_K_BYTES[0]:
            parts.append(f"k{self.stage_k_bytes}")
        parts.append(_DECOMP_TAGS[self.decomposition])
        return "_".join(parts)

    @property
    def key(self) -> str:
        """Stable string naming the whole variant, e.g. `sm90_128x256_c2x1_coop_tma_dp_rm_s1`
        (a split-K config carries its split count: `..._sk4_rm_s1`; a swapped one `_swap`
        after its cluster: `sm90_256x208_c1x2_swap_coop_tma_dp_rm_s8`; stages wider than 128 bytes
        in K their width after the epilogue: `sm90_64x16_c1x1_swap_pp_tma_k256_dp_rm_s8`)."""
        splits = str(self.splits) if self.decomposition is Decomposition.SPLIT_K else ""
        return f"{self.compile_key}{splits}_r{_RASTER_TAGS[self.raster]}_s{self.swizzle}"

    def __str__(self) -> str:
        return self.key

    @classmethod
    def from_key(cls, key: str) -> GemmConfig:
        """Parse a `key` back into the config it names."""
        pattern = (
            r"(?P<arch>sm\d+)_(?P<tm>\d+)x(?P<tn>\d+)_c(?P<cm>\d+)x(?P<cn>\d+)(?P<two>_2cta)?"
            r"(?P<swap>_swap)?_(?P<sched>coop|pp)_(?P<epi>tma|st)(?:_k(?P<kb>\d+))?_(?P<dec>dp|streamk|sk)(?P<splits>\d+)?_r(?P<raster>[mn])_s(?P<sw>\d+)"
        )
        match = re.fullmatch(pattern, key)
        if match is None:
            raise InvalidConfigError(f"{key!r} is not a GemmConfig key")
        g = match.groupdict()
        decomposition = {tag: d for d, tag in _DECOMP_TAGS.items()}[g["dec"]]
        return cls(
            arch=g["arch"][:2] + "_" + g["arch"][2:],
            tile_m=int(g["tm"]),
            tile_n=int(g["tn"]),
            cluster_m=int(g["cm"]),
            cluster_n=int(g["cn"]),
            two_cta=g["two"] is not None,
            swap_ab=g["swap"] is not None,
            schedule={tag: v for v, tag in _SCHEDULE_TAGS.items()}[g["sched"]],
            tma_store=g["epi"] == "tma",
            stage_k_bytes=int(g["kb"] or STAGE_K_BYTES[0]),
            decomposition=decomposition,
            splits=int(g["splits"] or 1),
            raster={tag: r for r, tag in _RASTER_TAGS.items()}[g["raster"]],
            swizzle=int(g["sw"]),
        )

    # -- data --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["decomposition"] = self.decomposition.value
        d["raster"] = self.raster.value
        d["schedule"] = self.schedule.value
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GemmConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise InvalidConfigError(f"unknown GemmConfig fields: {sorted(unknown)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GemmConfig:
        return cls.from_dict(json.loads(text))

    def with_runtime(
        self,
        *,
        splits: int | None = None,
        raster: Raster | str | None = None,
        swizzle: int | None = None,
    ) -> GemmConfig:
        """The same binary with other runtime arguments. Only those are checked again (the
        binary's fields were checked when `self` was made): the ranking makes a variant of
        every binary at every split count, over ten thousand per problem."""
        variant = copy.copy(self)
        if splits is not None:
            object.__setattr__(variant, "splits", splits)
        if raster is not None:
            try:
                object.__setattr__(variant, "raster", Raster(raster))
            except ValueError:
                choices = ", ".join(v.value for v in Raster)
                raise InvalidConfigError(f"raster={raster!r} is not one of: {choices}") from None
        if swizzle is not None:
            object.__setattr__(variant, "swizzle", swizzle)
        variant._validate_runtime()
        return variant


def expand_families(
    families: Sequence[dict[str, Any]], decompositions: Iterable[Decomposition]
) -> Iterator[GemmConfig]:
    """Every config of every family (a dict of compile-time fields) under each decomposition,
    runtime fields at their defaults (split-K at 2 splits)."""
    for decomposition in decompositions:
        splits = 2 if decomposition is Decomposition.SPLIT_K else 1
        for fields in families:
            yield GemmConfig(**fields, decomposition=decomposition, splits=splits)
