"""Detection: findings and samples become conditions; conditions become incidents with a root cause."""
