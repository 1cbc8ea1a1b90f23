"""Getting events and reports to the controller: on-disk buffer, storm suppression, stream."""
