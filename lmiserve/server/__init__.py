"""HTTP and gRPC: routes per protocol, middleware, error mapping, metrics and the server's start-up.
Everything a request runs on sits in ``lmiserve.serving``."""
