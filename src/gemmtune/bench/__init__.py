"""Timing and verification of GEMM candidates."""
