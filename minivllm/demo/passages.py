"""Prompts cut from a ``demo.train`` data file, on one side of its train/validation split.

Two tools need prompts of real text whose provenance is known exactly:

* ``minivllm bench spec --prompt-file`` times speculative decoding on *held-out* text:
  prompts cut from the validation passages, which neither the target nor a draft trained
  with ``demo.train`` on the same file (and the same ``--val-every``) ever saw;
* ``python -m minivllm.demo.distill`` asks the target to continue prompts cut from the
  *training* passages only, so the distilled text a draft learns from says nothing about
  the validation passages either.

The split is ``demo.train``'s own: ``split_passages`` applied to the passage indices, so
a passage is a validation passage here exactly when training held it out. A prompt is a
few consecutive passages of one run (a stretch of the file that lies on one side of the
split), each passage's ids followed by the end-of-sequence id: the layout of the token
stream the model trained on, so the model continues with the next passage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minivllm.demo.train import split_passages


@dataclass(frozen=True)
class PassagePrompt:
    """One prompt: passages ``first`` to ``first + count - 1`` of the data file (indices
    into ``read_passages``' list) and their token ids, each passage ended by eos."""

    first: int
    count: int
    token_ids: list[int]


def split_runs(num_passages: int, val_every: int) -> tuple[list[range], list[range]]:
    """The runs of consecutive passage indices on each side of ``split_passages``' split:
    (training runs, validation runs), each run in file order.

    Raises:
        ValueError: ``val_every`` is below 1.
    """
    if val_every < 1:
        raise ValueError(f"val_every must be >= 1, got {val_every}")
    train, val = split_passages(list(range(num_passages)), val_every)
    return _runs(train), _runs(val)


def _runs(indices: list[int]) -> list[range]:
    runs: list[range] = []
    for i in indices:
        if runs and runs[-1].stop == i:
            runs[-1] = range(runs[-1].start, i + 1)
        else:
            runs.append(range(i, i + 1))
    return runs


def cut_prompts(
    tokenizer: Any,
    passages: Sequence[str],
    runs: Sequence[range],
    num_prompts: int,
    min_tokens: int,
    names: tuple[str, str] = ("--num-prompts", "--prompt-tokens"),
) -> list[PassagePrompt]:
    """``num_prompts`` prompts of consecutive passages, none crossing a run's end.

    Each run is cut from its start into disjoint prompts of whole passages, each the
    fewest passages that reach ``min_tokens`` tokens (eos included; a run's tail that
    does not reach it is left out). The prompts are taken round-robin over the runs
    (every run's first prompt, then every run's second, ...), so a few prompts already
    spread over the whole file. Deterministic: no random draw.

    Args:
        tokenizer: The target's Hugging Face tokenizer (passages are encoded without
            special tokens, as ``demo.train`` encodes them).
        passages: ``read_passages`` of the data file.
        runs: Index runs from ``split_runs`` (one side of the split).
        num_prompts: How many prompts to return.
        min_tokens: The length a prompt reaches before it ends at a passage boundary.
        names: The command-line names of ``num_prompts`` and ``min_tokens``, for errors.

    Raises:
        ValueError: A count is below 1, or the runs hold fewer than ``num_prompts``
            prompts (the message says how many they hold).
    """
    for name, value in zip(names, (num_prompts, min_tokens), strict=True):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id to end each passage with")
    per_run = [_cut_run(tokenizer, passages, run, min_tokens, eos) for run in runs]
    ordered = [
        run_prompts[j]
        for j in range(max(map(len, per_run), default=0))
        for run_prompts in per_run
        if j < len(run_prompts)
    ]
    if len(ordered) < num_prompts:
        raise ValueError(
            f"{names[0]} {num_prompts}: these passages give only {len(ordered)} prompts "
            f"of at least {min_tokens} tokens ({names[1]})"
        )
    return ordered[:num_prompts]


def _cut_run(
    tokenizer: Any, passages: Sequence[str], run: range, min_tokens: int, eos: int
) -> list[PassagePrompt]:
    if len(run) == 0:
        return []
    encoded = tokenizer([passages[i] for i in run], add_special_tokens=False)["input_ids"]
    prompts, ids, first = [], [], run.start
    for index, passage_ids in zip(run, encoded, strict=True):
        ids += [*passage_ids, eos]
        if len(ids) >= min_tokens:
            prompts.append(PassagePrompt(first, index - first + 1, ids))
            ids, first = [], index + 1
    return prompts
