"""What the agent, the relay and the controller share: the vocabulary both sides must agree
on, the Xid catalog, findings, names, TLS and auth, logging, and small gRPC and HTTP machinery.

It imports only the wire contract (``starpulse.v1``) and third-party libraries.
"""
