"""The command line's engine arguments are generated from ``EngineArgs``: each field
becomes a flag of the right type, and the parsed values build the same ``EngineArgs``."""

from __future__ import annotations

import argparse

import pytest

from minivllm.engine.arg_utils import EngineArgs


def _parse(*argv: str):
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    return EngineArgs.from_cli_args(parser.parse_args(["--model", "some/model", *argv]))


def test_defaults_match_engine_args() -> None:
    args = _parse()
    assert args.model == "some/model"
    assert args.max_num_seqs == 256 and args.enforce_eager is False
    assert args.async_scheduling is None  # tri-state: None picks automatically


@pytest.mark.parametrize(("flag", "value"), [("--async-scheduling", True),
                                             ("--no-async-scheduling", False)])
def test_optional_bool_flags_are_booleans(flag: str, value: bool) -> None:
    assert _parse(flag).async_scheduling is value


def test_typed_flags() -> None:
    args = _parse("--max-num-seqs", "8", "--gpu-memory-utilization", "0.5", "--enforce-eager")
    assert (args.max_num_seqs, args.gpu_memory_utilization, args.enforce_eager) == (8, 0.5, True)
