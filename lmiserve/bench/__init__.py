"""``lmiserve bench``: load generation against a running server, and transformers' own generate as the baseline."""
