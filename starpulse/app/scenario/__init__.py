"""Scenarios: a fabric, jobs and timed faults (spec), and a simulated cluster that plays them (cluster)."""

from starpulse.app.scenario.spec import (
    FAULT_KINDS,
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
    "FAULT_KINDS",
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
