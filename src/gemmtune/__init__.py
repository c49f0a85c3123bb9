"""gemmtune: autotuned persistent GEMM kernels for Hopper and Blackwell, in the CuTe DSL."""

from gemmtune.config import GemmConfig
from gemmtune.problem import GemmProblem

__version__ = "0.1.0"

__all__ = ["GemmConfig", "GemmProblem", "__version__"]
