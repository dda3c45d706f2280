"""The engine's process and the API process's handles on it: the clients, the outbox that sends
each step's deltas, and the standby process that waits to take over a restart."""
