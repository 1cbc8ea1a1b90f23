"""Fakes at the hardware edge (NVML, sysfs, kernel log) with fault injection.

They implement the same surface as the real thing so the real collectors run unchanged.
"""
