"""The entries a kernel's binaries are compiled from (`build.ENTRIES`), shared by the Hopper and
Blackwell kernels. Each traces the kernel's `launch(a, b, c, scale_a, scale_b, workspace,
counters, along_n, swizzle, splits, max_active_clusters, stream)`, passing None for what its
signature lacks. Imports the DSL: kernel-side only.
"""

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Int32


class GemmEntries:
    """The plain entry (`__call__`) and the scaled (fp8) one (`scaled`)."""

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        c: cute.Tensor,
        workspace: cute.Tensor,
        counters: cute.Tensor,
        along_n: Int32,
        swizzle: Int32,
        splits: Int32,
        max_active_clusters: Int32,
        stream: cuda.CUstream,
    ):
        self.launch(
            a, b, c, None, None, workspace, counters, along_n, swizzle, splits,
            max_active_clusters, stream,
        )  # fmt: skip

    @cute.jit
    def scaled(
        self,
        a: cute.Tensor,
        b: cute.Tensor,
        c: cute.Tensor,
        scale_a: cute.Tensor,
        scale_b: cute.Tensor,
        workspace: cute.Tensor,
        counters: cute.Tensor,
        along_n: Int32,
        swizzle: Int32,
        splits: Int32,
        max_active_clusters: Int32,
        stream: cuda.CUstream,
    ):
        """The entry of a scaled (fp8) signature: `scale_a` and `scale_b` are 1-D fp32, one
        element each ("tensor" scaling) or one per row of a and per column of b ("row")."""
        self.launch(
            a, b, c, scale_a, scale_b, workspace, counters, along_n, swizzle, splits,
            max_active_clusters, stream,
        )  # fmt: skip
