"""A stand-in for the compile workers' service: no DSL, and the ways a compile can go wrong,
keyed by tile width. Imported by the spawned compile workers (they inherit sys.path)."""

import os
import time
from pathlib import Path

from gemmtune.core.config import GemmConfig
from gemmtune.kernels.build import artifact_name
from gemmtune.kernels.signature import KernelSignature

CRASH, HANG, FAIL = 64, 96, 128  # tile_n of a compile that kills its worker, hangs, fails


class FakeCompileService:
    def __init__(self, target):
        self.target = target

    def handle(self, kind, payload):
        config = GemmConfig.from_json(payload[0])
        if config.tile_n == CRASH:
            os._exit(11)
        if config.tile_n == HANG:
            time.sleep(3600)
        if config.tile_n == FAIL:
            raise RuntimeError("ptxas: too many registers")
        path = Path(payload[2]) / artifact_name(config, KernelSignature(**payload[1]))
        path.write_text(f"{os.getpid()}")
        return str(path), 0.25

    @staticmethod
    def poisoned(error):
        return False
