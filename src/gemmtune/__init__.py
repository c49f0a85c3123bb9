"""gemmtune: autotuned persistent GEMM kernels for Hopper and Blackwell, in the CuTe DSL.

The public names are loaded on first use: a helper process (a compile worker, the benchmark
worker) imports `gemmtune.<module>` and pays only for what that module needs, never for the
API layer, torch's custom op or the tuner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "tuned_gemm": "gemmtune.api.dispatch",
    "int_mm": "gemmtune.api.dispatch",
    "scaled_mm": "gemmtune.api.dispatch",
    "plan": "gemmtune.api.dispatch",
    "pretune": "gemmtune.api.pretune",
    "autotune": "gemmtune.tuning.autotune",
    "GemmConfig": "gemmtune.core.config",
    "GemmProblem": "gemmtune.core.problem",
    "TunedLinear": "gemmtune.api.torch_ops",
    "InductorPass": "gemmtune.api.inductor",
    "install_inductor_pass": "gemmtune.api.inductor",
    "use_tuned_linear": "gemmtune.api.torch_ops",
    "TuneResult": "gemmtune.tuning.tuner",
    "tune": "gemmtune.tuning.tuner",
    "start_workers": "gemmtune.workers",
}

#: public names that their module calls otherwise
_NAMES_THERE = {"start_workers": "start"}

__all__ = [
    "GemmConfig",
    "GemmProblem",
    "InductorPass",
    "TuneResult",
    "TunedLinear",
    "__version__",
    "autotune",
    "install_inductor_pass",
    "int_mm",
    "plan",
    "pretune",
    "scaled_mm",
    "start_workers",
    "tune",
    "tuned_gemm",
    "use_tuned_linear",
]

if TYPE_CHECKING:
    from gemmtune.api.dispatch import int_mm, plan, scaled_mm, tuned_gemm
    from gemmtune.api.inductor import InductorPass, install_inductor_pass
    from gemmtune.api.pretune import pretune
    from gemmtune.api.torch_ops import TunedLinear, use_tuned_linear
    from gemmtune.core.config import GemmConfig
    from gemmtune.core.problem import GemmProblem
    from gemmtune.tuning.autotune import autotune
    from gemmtune.tuning.tuner import TuneResult, tune
    from gemmtune.workers import start as start_workers


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gemmtune' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _NAMES_THERE.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


#: Our helper processes (compile workers, the benchmark worker) are named with this prefix.
HELPER_PROCESS_PREFIX = "gemmtune-"


def _in_helper_process() -> bool:
    import multiprocessing

    return multiprocessing.current_process().name.startswith(HELPER_PROCESS_PREFIX)


if not _in_helper_process():
    # `torch.ops.gemmtune.*` exist from `import gemmtune` on, as users of a library's custom ops
    # expect (a compiled or exported model that calls them loads after the import). A helper
    # process never calls them, and a compile worker runs without torch at all.
    from gemmtune.api import torch_ops  # noqa: F401
    from gemmtune.workers import zygote

    # the last statement: the zygote is forked from a process that has imported all of gemmtune
    zygote.start_if_safe()
