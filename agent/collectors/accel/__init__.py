"""Accelerator backends: one small protocol, one implementation per vendor (issue 21)."""
