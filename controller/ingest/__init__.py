"""Ingest: agents' and relays' streams, the node registry, message validation and rate limits.

The controller's lowest floor above the store: it decides nothing itself but hands reports
to a decider (in-process detection or its shards) that the service wires in.
"""
