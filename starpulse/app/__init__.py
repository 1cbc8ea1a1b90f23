"""The composition root: the CLI, settings files, the demo and the scenario runner.

It wires the programs together and is imported by nothing but tests.
"""
