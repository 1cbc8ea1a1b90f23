"""Jobs: which training job runs on which node and rank, its steps and checkpoints, from reports."""
