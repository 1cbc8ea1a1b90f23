"""The relay tier: agents' streams terminated near them and carried to the controller in batches."""
