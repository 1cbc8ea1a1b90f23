"""The starpulse controller: ingest, store, detection, healing and outputs."""
