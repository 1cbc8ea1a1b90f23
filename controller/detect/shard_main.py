"""``python -m controller.detect.shard_main``: one detection shard process (controller.detect.shards starts it).

A module of its own so that the worker's classes, pickled both ways (ShardSettings,
ReportResult), are ``controller.detect.shard_worker``'s at both ends, never ``__main__``'s.
"""

from controller.detect.shard_worker import main

main()
