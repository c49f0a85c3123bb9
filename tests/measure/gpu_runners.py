"""GPU runners for the tests: the real `GemmRunner`, except that two tile shapes misbehave,
one with a real fault (a store to an unmapped address), one with a wrong answer."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_ptr

from gemmtune.core.config import GemmConfig
from gemmtune.measure.runner import GemmRunner

FAULT = (64, 64)
WRONG = (64, 96)


@cute.kernel
def _store_to(pointer: cute.Pointer):
    cute.make_tensor(pointer, cute.make_layout(1))[0] = cutlass.Int32(1)


@cute.jit
def _launch_store(pointer: cute.Pointer, stream: cuda.CUstream):
    _store_to(pointer).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)


def illegal_store() -> None:
    """Store to global address 0x10: an illegal address, which poisons the CUDA context."""
    pointer = make_ptr(cutlass.Int32, 0x10, cute.AddressSpace.gmem, assumed_align=4)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    cute.compile(_launch_store, pointer, stream)(pointer, stream)
    torch.cuda.synchronize()


class MisbehavingRunner(GemmRunner):
    def measure(self, job):
        config = GemmConfig.from_json(job.config_json)
        tile = (config.tile_m, config.tile_n)
        if tile == FAULT:
            illegal_store()
        if tile == WRONG:
            # the kernel multiplies other inputs than the reference's: a wrong result
            saved, self.b = self.b, torch.randn_like(self.b)
            try:
                return super().measure(job)
            finally:
                self.b = saved
        return super().measure(job)
