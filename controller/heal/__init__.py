"""Self-healing: remediation state, policy, guards and hot spares for the controller."""
