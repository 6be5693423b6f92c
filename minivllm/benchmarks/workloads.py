"""The benchmark workloads, generated exactly as published so numbers are comparable.

The throughput workload is the one nano-vllm and others publish: 256 requests; with
``random.seed(0)``, each prompt is ``randint(100, 1024)`` tokens drawn by
``randint(0, 10000)``, then each output length is ``randint(100, 1024)``; EOS ignored.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Workload:
    """Token-id prompts and the number of tokens to generate for each."""

    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_prompt_tokens(self) -> int:
        """Sum of prompt lengths."""
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        """Sum of output lengths."""
        return sum(self.output_lens)

    def head(self, n: int) -> Workload:
        """The first ``n`` requests."""
        return Workload(self.prompts[:n], self.output_lens[:n])


def throughput_workload(
    num_requests: int = 256, seed: int = 0,
    input_len_range: tuple[int, int] = (100, 1024),
    output_len_range: tuple[int, int] = (100, 1024),
) -> Workload:
    """The community throughput workload (prompts drawn first, then output lengths).

    The length ranges only change for smoke tests; the published workload is the
    default.
    """
    rng = random.Random(seed)
    prompts = [
        [rng.randint(0, 10000) for _ in range(rng.randint(*input_len_range))]
        for _ in range(num_requests)
    ]
    output_lens = [rng.randint(*output_len_range) for _ in range(num_requests)]
    return Workload(prompts, output_lens)


def shared_prefix_workload(
    num_requests: int = 64, prefix_len: int = 4096, suffix_len: int = 32,
    output_len: int = 16, seed: int = 0,
) -> Workload:
    """Requests that share one long prefix (a system prompt, a document) and differ in a
    short suffix: the case prefix caching exists for."""
    rng = random.Random(seed)
    prefix = [rng.randint(0, 10000) for _ in range(prefix_len)]
    prompts = [
        prefix + [rng.randint(0, 10000) for _ in range(suffix_len)] for _ in range(num_requests)
    ]
    return Workload(prompts, [output_len] * num_requests)


# Public-domain passages (King James Bible, the demo model's training text): a prompt
# quotes one twice, so what comes next is most likely the passage a third time.
PASSAGES = (
    "In the beginning God created the heaven and the earth. And the earth was without "
    "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
    "moved upon the face of the waters. And God said, Let there be light: and there was "
    "light.",
    "The LORD is my shepherd; I shall not want. He maketh me to lie down in green "
    "pastures: he leadeth me beside the still waters. He restoreth my soul: he leadeth "
    "me in the paths of righteousness for his name's sake.",
    "To every thing there is a season, and a time to every purpose under the heaven: a "
    "time to be born, and a time to die; a time to plant, and a time to pluck up that "
    "which is planted.",
    "In the beginning was the Word, and the Word was with God, and the Word was God. The "
    "same was in the beginning with God. All things were made by him; and without him "
    "was not any thing made that was made.",
)


def repetitive_prompts(tokenizer, num_prompts: int, vocab_size: int, seed: int = 0,
                       passage_len: int = 48) -> list[list[int]]:
    """Prompts that repeat themselves, the workload speculative decoding's n-gram
    proposer feeds on (``bench spec``): each quotes a passage twice and begins it a
    third time.

    With a tokenizer the passages are English (``PASSAGES``, cycled); without one (a
    random-weight checkpoint) each prompt is a made-up passage of ``passage_len`` token
    ids below ``vocab_size``, twice. Whether the model goes on copying is the model's
    business; a small one rather repeats its own phrases, which n-gram drafts feed on
    as well.
    """
    rng = random.Random(seed)
    prompts = []
    for i in range(num_prompts):
        if tokenizer is not None:
            passage = PASSAGES[i % len(PASSAGES)]
            words = passage.split()
            start = " ".join(words[: len(words) // 3])  # the third copy, begun
            text = f"Repeat this passage word for word.\n{passage}\n{passage}\n{start}"
            prompts.append(list(tokenizer.encode(text)))
        else:
            low, high = min(100, vocab_size // 2), min(vocab_size, 10000)
            ids = [rng.randrange(low, high) for _ in range(passage_len)]
            prompts.append(ids + ids)
    return prompts


def heldout_prompts(
    tokenizer, path: str, num_prompts: int, val_every: int, min_tokens: int
) -> dict[str, Any]:
    """Held-out continuations (``bench spec --prompt-file``): prompts cut from the
    validation passages of the ``demo.train`` data file ``path``, which a target and a
    draft trained on that file with ``--val-every val_every`` never saw.

    Each prompt is the fewest consecutive validation passages that reach ``min_tokens``
    tokens, each passage's ids followed by eos as in training, so the model goes on with
    the next passage (``minivllm.demo.passages.cut_prompts``: the first prompt of each
    held-out block of 100 passages, then the second, ...). Returns the prompts
    (``"prompts"``) with the record of how they were cut: the file's name, size and
    sha256, ``val_every``, ``min_tokens`` and each prompt's passage indices.

    Raises:
        ValueError: The file has no text, or its validation passages give fewer than
            ``num_prompts`` prompts (the message names ``--num-prompts``).
    """
    from minivllm.demo.passages import cut_prompts, split_runs
    from minivllm.demo.train import read_passages

    data = Path(path).read_bytes()
    try:
        passages = read_passages(path)
    except ValueError as exc:  # its message names demo.train's --data
        raise ValueError(f"--prompt-file {path!r} has no text") from exc
    _, val_runs = split_runs(len(passages), val_every)
    prompts = cut_prompts(tokenizer, passages, val_runs, num_prompts, min_tokens)
    return {
        "prompts": [p.token_ids for p in prompts],
        "file": Path(path).name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "val_every": val_every,
        "min_tokens": min_tokens,
        "validation_passages": sum(len(r) for r in val_runs),
        "cut": "consecutive validation passages of one held-out block (demo.train's "
        "split_passages), the fewest that reach min_tokens, each followed by eos",
        "passages": [[p.first, p.count] for p in prompts],
    }
