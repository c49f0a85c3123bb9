"""gemmtune: autotuned persistent GEMM kernels for Hopper and Blackwell, in the CuTe DSL."""

__version__ = "0.1.0"

from gemmtune.api import tuned_gemm
from gemmtune.config import GemmConfig
from gemmtune.problem import GemmProblem
from gemmtune.tuner import TuneResult, tune

__all__ = ["GemmConfig", "GemmProblem", "TuneResult", "__version__", "tune", "tuned_gemm"]
