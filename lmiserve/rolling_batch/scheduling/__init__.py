"""Which sequences run in a step and what they hold: the scheduler, the paged KV blocks and the
sequences themselves. Plain Python, no torch."""
