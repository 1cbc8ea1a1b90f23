"""One module per telemetry source; each implements ``agent.collectors.base.Collector``."""
