"""starpulse: GPU cluster health monitoring and fault self-healing.

The floors, bottom to top (``docs/architecture.md``; enforced by import-linter in
``pyproject.toml``): ``starpulse.v1`` the generated wire contract, ``starpulse.core`` what
every program shares, the programs (``agent``, ``relay``, ``controller``), and
``starpulse.app`` the composition root (CLI, settings, demo, scenarios) that nothing imports.
``starpulse.job`` is the library a training job imports; it depends on nothing of ours.
"""

__version__ = "0.1.0"
