"""The engine's loop: each step scheduled, run and its outputs handed back (serially or
overlapped), beam searches advanced, faults ending one sequence, and the measured speeds."""
