"""`python -m starpulse.app.cli`: the same as the `starpulse` console script."""

from starpulse.app.cli import entrypoint

raise SystemExit(entrypoint())
