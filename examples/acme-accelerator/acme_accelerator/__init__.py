"""A toy accelerator backend for starpulse (see README.md)."""
