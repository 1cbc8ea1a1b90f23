"""The query surface: what outputs read of the controller's state, and nothing they could change.

Outputs (the gRPC Query service, the HTTP API and dashboard, the Admin service's reads) ask
``surface.Queries`` for incidents, an incident's history and timeline, the topology, jobs
and node status, never detection's parts. ``store.StoreQueries`` answers from the SQLite
file alone (what an HA standby serves from its replicated copy); ``live.LiveQueries``
answers the leader's questions from its in-memory state where that is fresher.
"""
