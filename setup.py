"""The one compiled part of gemmtune: the plan-cache key of `tuned_gemm` (a small C module
built with Python's headers alone). It is optional: where no C compiler is present the install
goes on and `tuned_gemm` reads the same key from Python, a few hundred nanoseconds slower."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gemmtune.api._signature",
            sources=["src/gemmtune/api/_signature.c"],
            optional=True,
        )
    ]
)
