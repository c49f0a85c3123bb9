"""A service that reports what its process looks like: the environment variable it is asked
for, its directory, name and parent. Imported by helpers through the sys.path they inherit."""

import multiprocessing
import os
import sys


class ProbeService:
    def __init__(self, init):
        self.init = init
        self.cutlass_imported = "cutlass" in sys.modules  # before this service asked for it

    def handle(self, kind, payload):
        if kind == "exit":
            os._exit(0)
        return {
            "env": os.environ.get(payload),
            "cwd": os.getcwd(),
            "name": multiprocessing.current_process().name,
            "ppid": os.getppid(),
            "pid": os.getpid(),
            "cutlass_imported": self.cutlass_imported,
        }

    @staticmethod
    def poisoned(error):
        return False
