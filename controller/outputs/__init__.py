"""Outputs: what the controller tells people and other systems (alert webhooks, the HTTP API
and dashboard, Prometheus metrics, the query and admin gRPC services).
"""
