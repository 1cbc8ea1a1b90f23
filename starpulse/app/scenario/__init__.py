"""Scenarios: a fabric, jobs and timed faults (spec), and a simulated cluster that plays them (cluster)."""

from starpulse.app.scenario.spec import (
    Expectations,
    ExpectedIncident,
    FabricSpec,
    FaultSpec,
    JobSpec,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_scenario,
)

__all__ = [
    "Expectations",
    "ExpectedIncident",
    "FabricSpec",
    "FaultSpec",
    "JobSpec",
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "parse_scenario",
]
