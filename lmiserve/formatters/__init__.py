"""Input parsers and output formatters, one module per protocol. Pure functions: no HTTP, no torch."""
