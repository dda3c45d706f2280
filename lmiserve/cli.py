"""The ``lmiserve`` command."""

from __future__ import annotations

import argparse
import sys

from .config import ConfigError
from .config.arguments import add_model_flags, settings_from_args
from .cpu_isa import CpuIsaError, apply_torch_env


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmiserve", description="LLM serving container in the style of SageMaker LMI."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the server")
    add_model_flags(serve)
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print the resolved settings and where each came from")
    add_model_flags(show)
    from .bench.command import add_arguments

    bench = sub.add_parser("bench", help="load a running server at several concurrency levels and report")
    add_arguments(bench)
    from .deploy.command import add_subcommands

    add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(raw)
    if args.command == "bench":
        from .bench.command import run as run_bench

        return run_bench(args)
    if args.command in ("deploy", "invoke"):
        from .deploy.command import run as run_deploy

        return run_deploy(args)
    try:
        # torch's and oneDNN's own kernels held to a forced CPU class, in this process and the
        # engine processes it starts: before anything imports torch
        apply_torch_env()
    except CpuIsaError as exc:
        print(f"lmiserve: {exc}", file=sys.stderr)
        return 2
    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"lmiserve: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        from .config.show import render

        print(render(settings))
        return 0
    from . import logs
    from .server.runner import run

    logs.configure(settings.server.log_level)
    return run(settings, raw[raw.index("serve") + 1 :])
