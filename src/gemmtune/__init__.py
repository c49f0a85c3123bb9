"""gemmtune: autotuned persistent GEMM kernels for Hopper and Blackwell, in the CuTe DSL."""

__version__ = "0.1.0"

from gemmtune.api import tuned_gemm
from gemmtune.autotune import autotune
from gemmtune.config import GemmConfig
from gemmtune.problem import GemmProblem
from gemmtune.torch_ops import TunedLinear, use_tuned_linear
from gemmtune.tuner import TuneResult, tune

__all__ = [
    "GemmConfig",
    "GemmProblem",
    "TuneResult",
    "TunedLinear",
    "__version__",
    "autotune",
    "tune",
    "tuned_gemm",
    "use_tuned_linear",
]
