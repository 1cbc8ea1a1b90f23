"""`starpulse simulate`: a fleet simulator on the controller's own decision code (issue 28 item 2)."""
