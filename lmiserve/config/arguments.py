"""The model flags of ``lmiserve serve`` and ``lmiserve config show`` (one per setting that has
a flag), and the settings a command line resolves: the command's own, and those each other API
process builds from the serve command's arguments."""

from __future__ import annotations

import argparse

from .loader import SPECS, Settings, load_settings


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", help="model directory (default: /opt/ml/model when present, else .)")
    parser.add_argument("--properties", help="serving.properties file (default: MODEL_DIR/serving.properties)")
    for spec in SPECS:
        if spec.cli:
            parser.add_argument(
                spec.cli,
                dest="key:" + spec.key,
                metavar=spec.key.upper().replace(".", "_"),
                help=f"{spec.doc} ({spec.key})",
            )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings the parsed model flags resolve."""
    cli = {k[len("key:") :]: v for k, v in vars(args).items() if k.startswith("key:") and v is not None}
    return load_settings(args.model_dir, args.properties, cli=cli)


def settings_of(serve_argv: list[str]) -> Settings:
    """The settings ``lmiserve serve SERVE_ARGV`` resolves (the other API processes build theirs so)."""
    parser = argparse.ArgumentParser(prog="lmiserve serve")
    add_model_flags(parser)
    return settings_from_args(parser.parse_args(serve_argv))
