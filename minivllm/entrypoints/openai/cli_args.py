"""The ``minivllm serve`` command's own flags (the engine's come from ``EngineArgs``).

Upstream counterpart: ``vllm/entrypoints/openai/cli_args.py`` (``make_arg_parser``).
"""

from __future__ import annotations

import argparse


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the server's flags to the ``serve`` subcommand's parser."""
    parser.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        help="model folder or hub id (same as --model; default: the built-in demo model)",
    )
    group = parser.add_argument_group("server arguments")
    group.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 for all)",
    )
    group.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    group.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer <key>' on /v1 routes (401 otherwise)",
    )
    group.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="name(s) the API answers to; the first is put in responses (default: the model)",
    )
    group.add_argument(
        "--no-playground",
        action="store_true",
        help="the live page at / only watches: no prompt box, no burst button",
    )
    group.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's log level (access lines are logged at info)",
    )
    return parser
