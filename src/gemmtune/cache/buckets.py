"""Which problems share a tuning result: sizes rounded into buckets, plus everything else that
changes the answer (dtypes, layouts, batching, GPU, versions)."""

from __future__ import annotations

import bisect
import functools
import os
from dataclasses import dataclass

from gemmtune.core.problem import GemmProblem
from gemmtune.kernels.signature import KernelSignature

BUCKETS_ENV = "GEMMTUNE_BUCKETS"


@dataclass(frozen=True)
class BucketPolicy:
    """How m, n and k are rounded: "exact", "pow2" (up to a power of two, the default), or
    "boundaries" (up to the next of the user's boundaries, powers of two beyond the last)."""

    kind: str = "pow2"
    boundaries: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("exact", "pow2", "boundaries"):
            raise ValueError(f"bucket policy {self.kind!r}: use exact, pow2 or boundaries")
        if self.kind == "boundaries" and (
            not self.boundaries or list(self.boundaries) != sorted(set(self.boundaries))
        ):
            raise ValueError("boundaries must be a non-empty increasing list of sizes")

    @classmethod
    def parse(cls, text: str) -> BucketPolicy:
        """ "exact", "pow2", or a comma-separated list of boundaries ("128,512,4096")."""
        text = text.strip()
        if text in ("exact", "pow2"):
            return cls(text)
        try:
            return cls("boundaries", tuple(int(x) for x in text.split(",")))
        except ValueError:
            raise ValueError(
                f"bucket policy {text!r}: use exact, pow2 or sizes such as 128,512,4096"
            ) from None

    @classmethod
    def from_env(cls) -> BucketPolicy:
        return cls.parse(os.environ.get(BUCKETS_ENV, "pow2"))

    def round(self, size: int) -> int:
        if self.kind == "exact" or size <= 1:
            return size
        if self.kind == "boundaries":
            i = bisect.bisect_left(self.boundaries, size)
            if i < len(self.boundaries):
                return self.boundaries[i]
        return 1 << (size - 1).bit_length()


@dataclass(frozen=True)
class Environment:
    """What a tuning result depends on besides the problem: the GPU and the software."""

    gpu: str
    sm_count: int
    gemmtune: str
    dsl: str

    @property
    def key(self) -> str:
        return f"{self.gpu}|{self.sm_count}sm|gemmtune {self.gemmtune}|dsl {self.dsl}"


@functools.cache
def current_environment(device_index: int) -> Environment:
    """The GPU `device_index` and the software a result tuned on it is valid for."""
    from gemmtune.core.device import device_info
    from gemmtune.core.versions import dsl_version, gemmtune_version

    info = device_info(device_index)
    return Environment(info.name, info.sm_count, gemmtune_version(), dsl_version())


def bucket_key(problem: GemmProblem, env: Environment, policy: BucketPolicy) -> str:
    """The results cache's key for `problem`: e.g.
    `m4096_n4096_k4096_2d|bf16_bf16_ak_bn_on_2d|NVIDIA H200|132sm|gemmtune 0.1.0|dsl 4.8.1`.
    Operands copied K-major before the kernel (`GemmProblem.copied`) are named after the
    signature (`..._copy_b`): such a bucket's times include the copy, and torch's contender
    multiplies the operands as given."""
    rank = "3d" if problem.batched else "2d"
    sizes = f"m{policy.round(problem.m)}_n{policy.round(problem.n)}_k{policy.round(problem.k)}"
    copies = "".join(f"_copy_{name}" for name in problem.copied)
    return f"{sizes}_{rank}|{KernelSignature.of(problem).key}{copies}|{env.key}"


def parse_key(key: str) -> dict:
    """A key `bucket_key` made, in its parts: bucket, signature, gpu, sms, versions."""
    parts = key.split("|")
    parts += [""] * (6 - len(parts))
    return {
        "bucket": parts[0],
        "signature": parts[1],
        "gpu": parts[2],
        "sms": parts[3],
        "versions": [p for p in parts[4:] if p],
    }
