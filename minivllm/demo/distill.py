"""Sequence-level distillation data for a draft model: what the target says, as text.

    python -m minivllm.demo.distill --model TARGET --data kjv.txt --out distill.txt
    python -m minivllm.demo.train --data distill.txt --tokenizer TARGET --out DRAFT ...

A draft model is worth what it agrees with the target, not how well it models the
original text. Sequence-level knowledge distillation (Kim and Rush, 2016) trains the
small model on the large model's own outputs instead of the data; speculative-decoding
drafts are distilled the same way (DistillSpec, Zhou et al., 2023). This script makes
that training text with minivllm's own ``LLM`` (batched; a GPU makes thousands of
continuations in seconds, the CPU works for a few):

* prompts are cut from the *training* passages of ``--data`` only, split exactly as
  ``demo.train`` splits it (``--val-every``): neither the distilled text nor a draft
  trained on it has seen a validation passage, so ``bench spec --prompt-file`` on the
  same file measures both on held-out text (``minivllm.demo.passages``);
* the target continues each prompt for ``--max-tokens`` tokens (eos ignored, so it goes
  on past the end of a passage, as it does in the benchmark); the continuation is cut at
  every eos it generated into passages, and each complete passage becomes one line of
  ``--out``: the format ``demo.train --data`` reads, whose token stream (each line's ids,
  then eos) is the target's own stream again. The tail after the last eos, cut off by
  ``--max-tokens``, is left out: a line ends where the target ended a passage;
* line breaks inside generated text become spaces, so a line is always one passage.

Beside ``--out``, ``<out stem>_log.json`` records the command, the target's weights and
tokenizer sha256 (as ``demo.train`` records them), the data file's, the counts and the
versions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minivllm.demo.passages import PassagePrompt, cut_prompts, split_runs
from minivllm.demo.train import read_passages


def build_arg_parser() -> argparse.ArgumentParser:
    """Arguments of the distillation script."""
    p = argparse.ArgumentParser(prog="python -m minivllm.demo.distill", description=__doc__)
    p.add_argument("--model", required=True, help="the target: a checkpoint folder")
    p.add_argument("--data", required=True, help="the target's demo.train --data file")
    p.add_argument("--out", required=True, help="text file to write, one passage per line")
    p.add_argument("--num-prompts", type=int, default=4000)
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=64,
        help="a prompt is the fewest consecutive training passages that reach this many tokens",
    )
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy, the target's argmax")
    p.add_argument("--seed", type=int, default=0, help="request i samples with seed + i")
    p.add_argument(
        "--val-every", type=int, default=50, help="the --val-every the target trained with"
    )
    p.add_argument("--max-num-seqs", type=int, default=256, help="requests per engine step")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    return p


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad arguments before anything is read or loaded; the message names the
    argument."""
    if not (Path(args.model) / "config.json").is_file():
        raise FileNotFoundError(f"--model {args.model!r}: no config.json there")
    if not (Path(args.model) / "tokenizer.json").is_file():
        raise FileNotFoundError(f"--model {args.model!r}: no tokenizer.json there")
    if not Path(args.data).is_file():
        raise FileNotFoundError(f"--data {args.data!r} is not a file")
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        raise ValueError(f"--out {args.out!r} must be a file in an existing folder")
    if out.resolve() == Path(args.data).resolve():
        raise ValueError("--out must not be the --data file")
    for name in ("num_prompts", "prompt_tokens", "max_tokens", "val_every", "max_num_seqs"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")


def one_line(text: str) -> str:
    """``text`` as one line: every line break ``str.splitlines`` knows (the reader of
    ``--data`` splits on them) becomes a space."""
    return " ".join(text.splitlines()).strip()


def load_prompts(args: argparse.Namespace, tokenizer: Any) -> tuple[list[PassagePrompt], dict]:
    """The prompts cut from the training passages, and the data file's record."""
    passages = read_passages(args.data)
    train_runs, _ = split_runs(len(passages), args.val_every)
    prompts = cut_prompts(tokenizer, passages, train_runs, args.num_prompts, args.prompt_tokens)
    data = Path(args.data).read_bytes()
    record = {
        "file": Path(args.data).name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "passages": len(passages),
        "training_passages": sum(len(r) for r in train_runs),
        "val_every": args.val_every,
    }
    return prompts, record


def _check_length(args: argparse.Namespace, prompts: list[PassagePrompt]) -> int:
    """The model length the engine needs; fails if the target's positions are fewer."""
    config = json.loads((Path(args.model) / "config.json").read_text(encoding="utf-8"))
    longest = max(len(p.token_ids) for p in prompts) + args.max_tokens
    limit = config.get("max_position_embeddings")
    if limit is not None and longest > limit:
        raise ValueError(
            f"--max-tokens {args.max_tokens}: the longest prompt ({longest - args.max_tokens} "
            f"tokens) plus it is {longest}, past the target's {limit} positions; lower "
            "--max-tokens or --prompt-tokens"
        )
    return longest


def generate(
    args: argparse.Namespace, prompts: list[PassagePrompt], max_model_len: int
) -> list[list[int]]:
    """The target's continuations (token ids) of every prompt, in prompt order."""
    from minivllm.llm import LLM
    from minivllm.sampling_params import SamplingParams

    sampled = args.temperature > 0
    params = [
        SamplingParams(
            temperature=args.temperature,
            max_tokens=args.max_tokens,
            ignore_eos=True,
            seed=args.seed + i if sampled else None,
        )
        for i in range(len(prompts))
    ]
    with LLM(
        args.model,
        dtype=args.dtype,
        device=args.device,
        max_model_len=max_model_len,
        max_num_seqs=args.max_num_seqs,
        seed=args.seed,
    ) as llm:
        inputs = [{"prompt_token_ids": p.token_ids} for p in prompts]
        outputs = llm.generate(inputs, params, use_tqdm=False)
    failed = [o for o in outputs if o.outputs[0].finish_reason == "error"]
    if failed:
        raise RuntimeError(
            f"{len(failed)} of {len(prompts)} continuations failed in the engine; the "
            f"first: {failed[0].outputs[0].stop_reason}"
        )
    return [list(o.outputs[0].token_ids) for o in outputs]


def split_at_eos(token_ids: list[int], eos: int) -> tuple[list[list[int]], int]:
    """The complete passages of one continuation (the ids before each eos) and the
    number of tokens after the last eos, which ``--max-tokens`` cut off."""
    pieces, current = [], []
    for token in token_ids:
        if token == eos:
            pieces.append(current)
            current = []
        else:
            current.append(token)
    return pieces, len(current)


def write_passages(path: Path, continuations: list[list[int]], tokenizer: Any) -> dict:
    """Write the complete passages of every continuation, one per line, and count them."""
    eos = tokenizer.eos_token_id
    lines: list[str] = []
    pieces_ids: list[list[int]] = []
    counts = {"empty_passages": 0, "tail_tokens_dropped": 0}
    for token_ids in continuations:
        pieces, tail = split_at_eos(token_ids, eos)
        counts["tail_tokens_dropped"] += tail
        for piece in pieces:
            # Special tokens are dropped: their text ("<|eos|>") would read back as them.
            text = one_line(tokenizer.decode(piece, skip_special_tokens=True))
            if not text:
                counts["empty_passages"] += 1
                continue
            lines.append(text)
            pieces_ids.append(piece)
    if not lines:
        raise RuntimeError("the target generated no complete passage: raise --max-tokens")
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    # demo.train encodes the text again; count the passages that come back as generated.
    encoded = tokenizer(lines, add_special_tokens=False)["input_ids"]
    same = sum(a == b for a, b in zip(encoded, pieces_ids, strict=True))
    return {
        "lines": len(lines),
        "distinct_lines": len(set(lines)),  # greedy text repeats itself; this says how much
        "tokens": sum(map(len, encoded)) + len(lines),  # with one eos per line
        "passages_retokenized_identical": same,
        "reads_back_identical": read_passages(str(path)) == lines,
        **counts,
    }


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _versions(device: str) -> dict[str, Any]:
    import torch
    import transformers

    on_gpu = device != "cpu" and torch.cuda.is_available()  # as the engine resolves "auto"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
    }


def log_path(out: str) -> Path:
    """Where the log of ``--out`` goes: ``<stem>_log.json`` beside it."""
    return Path(out).with_name(Path(out).stem + "_log.json")


def main(argv: Sequence[str] | None = None) -> int:
    """Cut the prompts, generate, write ``--out`` and its log."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_arg_parser().parse_args(argv)
    check_args(args)
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"--model {args.model!r}: its tokenizer has no eos token")
    prompts, data = load_prompts(args, tokenizer)
    max_model_len = _check_length(args, prompts)
    print(f"{len(prompts)} prompts from {data['training_passages']} training passages")

    start = time.perf_counter()
    continuations = generate(args, prompts, max_model_len)
    seconds = time.perf_counter() - start
    generated = sum(map(len, continuations))
    print(f"{generated} tokens generated in {seconds:.1f} s")
    written = write_passages(Path(args.out), continuations, tokenizer)

    model = Path(args.model)
    log = {
        "command": "python -m minivllm.demo.distill " + shlex.join(argv),
        "args": vars(args),
        "versions": _versions(args.device),
        "target": {
            "model": str(model),
            "model_sha256": _sha256(model / "model.safetensors"),
            "tokenizer_sha256": _sha256(model / "tokenizer.json"),
        },
        "data": data,
        "prompts": {
            "count": len(prompts),
            "min_tokens": args.prompt_tokens,
            "tokens": sum(len(p.token_ids) for p in prompts),
            "first_passages": [p.first for p in prompts[:8]],
        },
        "generation": {
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "seed": args.seed,
            "generated_tokens": generated,
            "seconds": seconds,  # engine start-up included
        },
        "output": {"file": Path(args.out).name, "sha256": _sha256(Path(args.out)), **written},
        "samples": Path(args.out).read_text(encoding="utf-8").splitlines()[:3],
    }
    log_path(args.out).write_text(json.dumps(log, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(log["output"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
