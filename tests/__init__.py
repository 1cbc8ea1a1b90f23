"""starpulse's tests: tests/ mirrors the source tree (docs/testing.md, "Where a test lives")."""
