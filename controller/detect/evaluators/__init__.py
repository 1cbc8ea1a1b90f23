"""One evaluator per rule kind, by family (gpu, nic, fields, switch, host, events,
presence), and the one registry that lists them (``registry.REGISTRY``). The shape of an
evaluator, and how the engine calls it, is in ``base``."""
