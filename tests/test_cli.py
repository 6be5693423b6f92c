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


@pytest.mark.parametrize(
    ("flag", "value"), [("--async-scheduling", True), ("--no-async-scheduling", False)]
)
def test_optional_bool_flags_are_booleans(flag: str, value: bool) -> None:
    assert _parse(flag).async_scheduling is value


def test_typed_flags() -> None:
    args = _parse("--max-num-seqs", "8", "--gpu-memory-utilization", "0.5", "--enforce-eager")
    assert (args.max_num_seqs, args.gpu_memory_utilization, args.enforce_eager) == (8, 0.5, True)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--temperature", "nan"], "argument --temperature: SamplingParams.temperature"),
        (["--temperature", "inf"], "finite"),
        (["--temperature", "-0.5"], "non-negative"),
        (["--top-p", "nan"], "argument --top-p: SamplingParams.top_p"),
        (["--top-p", "0"], "(0, 1]"),
        (["--top-k", "-2"], "argument --top-k: SamplingParams.top_k"),
        (["--max-tokens", "0"], "argument --max-tokens: SamplingParams.max_tokens"),
        (["--seed-sampling", str(2**64)], "argument --seed-sampling: SamplingParams.seed"),
        (["--temperature", "warm"], "argument --temperature: invalid float value: 'warm'"),
    ],
)
def test_generate_refuses_bad_sampling_flags(argv: list[str], words: str, capsys) -> None:
    from minivllm.cli import main

    # Refused while parsing: exit status 2, one line naming the flag, no model loaded.
    with pytest.raises(SystemExit) as info:
        main(["generate", *argv])
    assert info.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--gpu-memory-utilization", "nan"], "gpu_memory_utilization must be in (0, 1]"),
        (["--cpu-kv-cache-space", "inf"], "cpu_kv_cache_space must be a positive, finite"),
        (["--cpu-kv-cache-space", "nan"], "cpu_kv_cache_space must be a positive, finite"),
        (["--max-num-seqs", "-1"], "max_num_seqs must be a positive integer"),
        (["--stream-interval", "0"], "stream_interval must be a positive integer"),
    ],
)
def test_generate_refuses_bad_engine_flags(argv: list[str], words: str, capsys) -> None:
    from minivllm.cli import main

    assert main(["generate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minivllm: error: ") and words in err and "Traceback" not in err
