"""`gemmtune doctor`: what this machine offers gemmtune, as a report people and scripts can read."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

import torch

from gemmtune.core.device import device_info, gpu_available
from gemmtune.core.settings import cache_dir
from gemmtune.core.versions import dsl_flavours, dsl_version, gemmtune_version, package_version

COMPILE_TARGETS = ("sm_90a", "sm_100a")


def dsl_report() -> dict[str, Any]:
    """The CuTe DSL's version and the CUDA flavour of its libraries (cu12 or cu13)."""
    return {
        "nvidia_cutlass_dsl": dsl_version(),
        "cuda_flavour": "+".join(dsl_flavours()) or None,
        "cuda_bindings": package_version("cuda-bindings"),
        "tvm_ffi": package_version("apache-tvm-ffi"),
    }


def _driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi prints it, else the CUDA driver API's."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if err == driver.CUresult.CUDA_SUCCESS and version:
            return f"CUDA {version // 1000}.{version % 1000 // 10}"
    except ImportError:
        pass
    return None


def gpu_report() -> list[dict[str, Any]]:
    """One entry per visible GPU."""
    if not gpu_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        info = device_info(index)
        gpus.append(
            {
                "index": index,
                "name": info.name,
                "compute_capability": f"{info.capability[0]}.{info.capability[1]}",
                "arch": info.arch.value,
                "sm_count": info.sm_count,
                "l2_mb": round(info.l2_bytes / 2**20, 1),
                "memory_gb": round(info.memory_bytes / 2**30, 1),
            }
        )
    return gpus


def compile_check(target: str, timeout: float = 300.0) -> dict[str, Any]:
    """Compile the smoke kernel for `target` in a fresh process (the DSL reads the target once)."""
    env = dict(os.environ, CUTE_DSL_ARCH=target)
    proc = subprocess.run(
        [sys.executable, "-m", "gemmtune.kernels.smoke"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"target": target, "ok": False, "error": " | ".join(tail)}
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["ptx_target"] != target:
        return {"target": target, "ok": False, "error": f"PTX targets {report['ptx_target']}"}
    return {"target": target, "ok": True, "compile_s": report["compile_s"]}


def _kernel_files() -> str:
    from gemmtune.kernels.build import artifact_suffix

    if artifact_suffix() == ".so":
        return "shared libraries (a C compiler links them): a cached kernel loads in ~1 ms"
    return (
        "object files (no C compiler found: cc, gcc or clang): loading a cached kernel imports "
        "the DSL, about 1 s for a process's first kernel"
    )


def report(compile_targets: tuple[str, ...] = ()) -> dict[str, Any]:
    """Everything `gemmtune doctor` shows."""
    return {
        "gemmtune": gemmtune_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "dsl": dsl_report(),
        "driver": _driver_version() if gpu_available() else None,
        "gpus": gpu_report(),
        "cache_dir": str(cache_dir()),
        "kernel_files": _kernel_files(),
        "compile": [compile_check(t) for t in compile_targets],
    }


def format_report(r: dict[str, Any]) -> str:
    """The report as lines for a terminal."""
    dsl = r["dsl"]
    lines = [
        f"gemmtune      {r['gemmtune']}",
        f"python        {r['python']}",
        f"torch         {r['torch']} (CUDA {r['torch_cuda'] or 'none: CPU build'})",
        f"CuTe DSL      nvidia-cutlass-dsl {dsl['nvidia_cutlass_dsl'] or 'NOT INSTALLED'}"
        f" ({dsl['cuda_flavour'] or 'no'} libraries), cuda-bindings {dsl['cuda_bindings']},"
        f" tvm-ffi {dsl['tvm_ffi'] or 'not installed'}",
        f"cache dir     {r['cache_dir']}",
        f"kernel files  {r['kernel_files']}",
    ]
    if r["gpus"]:
        lines.append(f"driver        {r['driver'] or 'unknown'}")
        for g in r["gpus"]:
            served = "served" if g["arch"] != "other" else "not served: falls back to torch.matmul"
            sm = "sm_" + g["compute_capability"].replace(".", "")
            lines.append(
                f"GPU {g['index']}         {g['name']}: {sm}"
                f" ({served}), {g['sm_count']} SMs, {g['l2_mb']} MB L2, {g['memory_gb']} GB"
            )
    else:
        lines.append(
            "GPU           none found: kernels can still be compiled here "
            "(CUTE_DSL_ARCH=sm_90a or sm_100a), running them needs an sm_90 or sm_100 GPU"
        )
    for c in r["compile"]:
        status = f"ok in {c['compile_s']} s" if c["ok"] else f"FAILED: {c['error']}"
        lines.append(f"compile       {c['target']}: {status}")
    return "\n".join(lines)
