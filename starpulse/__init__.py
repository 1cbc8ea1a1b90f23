"""starpulse: GPU cluster health monitoring and fault self-healing.

This package holds only what the agent and the controller share: the generated
wire contract (``starpulse.v1``), the XID catalog, findings, logging and the CLI.
"""

__version__ = "0.1.0"
