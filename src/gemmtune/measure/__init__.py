"""Measuring candidates honestly: timing, verification, and what a benchmark worker runs."""
