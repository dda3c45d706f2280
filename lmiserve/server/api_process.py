"""An API process beside the main one (``api_processes`` above 1).

Started by the main process as ``python -m lmiserve.server.api_process --index K --private-dir
DIR -- <the serve command's arguments>``: it builds the same settings, binds the same HTTP port
(``SO_REUSEPORT``) and its own socket in the private directory, and serves the same app, with
the engine models attached to the main process's engines and everything else passed on
(:mod:`.forward`). It dies with the main process and drains on SIGTERM like it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from ..child import die_with_parent
from ..config import ConfigError
from ..config.arguments import settings_of
from ..serving import AttachedModels, ModelRegistry
from .api_processes import process_socket, reuse_port_socket, unix_socket
from .app import create_app
from .drain import DrainingServer
from .forward import MainLink
from .runner import uvicorn_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lmiserve.server.api_process")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--private-dir", required=True)
    parser.add_argument("serve", nargs=argparse.REMAINDER)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent()
    from .. import logs

    serve_args = [a for a in args.serve if a != "--"]
    try:
        settings = settings_of(serve_args)
    except ConfigError as exc:
        print(f"lmiserve: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.server.log_level, f"api process {args.index} pid {os.getpid()}")
    # gRPC is the main process's; this one serves HTTP only
    settings = dataclasses.replace(settings, server=settings.server.model_copy(update={"grpc_port": 0}))
    registry = ModelRegistry()
    models = AttachedModels(registry, settings, args.index)
    link = MainLink(args.private_dir, models)
    app = create_app(registry, settings, on_startup=link.sync, link=link, process_index=args.index)
    server = DrainingServer(uvicorn_config(app, settings), app.state.drain, settings.server.drain_timeout)
    path = process_socket(args.private_dir, args.index)
    if os.path.exists(path):  # left by a process that died before it
        os.unlink(path)
    sockets = [reuse_port_socket(settings.server.host, settings.server.port), unix_socket(path)]
    server.run(sockets=sockets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
