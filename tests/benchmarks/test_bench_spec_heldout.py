"""``minivllm bench spec --prompt-file``: held-out continuations as the batch-1 workload.

On the CPU with the demo model and tiny counts: the prompts are cut from the validation
passages of the data file only (demo.train's split), the JSON says which workload ran
and how, and bad arguments fail before any engine is built.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from minivllm.benchmarks import spec_decode
from minivllm.cli import main
from minivllm.demo import demo_model_path
from minivllm.demo.train import split_passages
from tests.demo.test_passages import write_data

SMALL = [
    "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "4",
    "--max-num-batched-tokens", "256", "--num-requests", "0", "--sweep-batch-sizes",
    "--ks", "2", "--num-prompts", "3", "--output-len", "8", "--margin-prompts", "0",
    "--allow-cpu", "--no-plot",
]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("heldout") / "data.txt"
    return path, write_data(path, 400)


@pytest.fixture(scope="module")
def result(data, tmp_path_factory) -> dict:
    path, _ = data
    out = tmp_path_factory.mktemp("spec") / "spec.json"
    argv = ["bench", "spec", "--model", str(demo_model_path()), "--output", str(out),
            "--prompt-file", str(path), "--prompt-val-every", "2", "--prompt-tokens", "40",
            *SMALL]  # fmt: skip
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_prompts_are_validation_passages(result, data) -> None:
    import transformers

    path, passages = data
    train_text, val_text = split_passages(passages, 2)
    tokenizer = transformers.AutoTokenizer.from_pretrained(demo_model_path())
    workload = result["workload"]
    assert workload["kind"] == "heldout_continuation" and workload["num_prompts"] == 3
    assert len(workload["passages"]) == 3
    for (first, count), length in zip(workload["passages"], workload["prompt_tokens"]):
        texts = passages[first : first + count]
        assert set(texts) <= set(val_text) and not set(texts) & set(train_text)
        ids = [t for text in texts for t in [*tokenizer.encode(text), tokenizer.eos_token_id]]
        assert len(ids) == length >= 40


def test_records_the_file_and_the_cut(result, data) -> None:
    path, _ = data
    workload = result["workload"]
    assert workload["file"] == path.name
    assert workload["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (workload["val_every"], workload["min_tokens"]) == (2, 40)
    assert workload["validation_passages"] == 200
    assert "--prompt-file" in result["command"]


def test_batch1_runs_on_the_heldout_prompts(result) -> None:
    off, ngram = result["batch1"]["off"], result["batch1"]["ngram"]["2"]
    assert off["output_tokens"] == ngram["output_tokens"] == 3 * 8
    assert ngram["identical_to_off"] == 3  # float32 on the CPU: lossless
    assert ngram["speedup_tpot"] == pytest.approx(off["tpot_ms"] / ngram["tpot_ms"])


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--prompt-val-every", "2"], "--prompt-val-every needs --prompt-file"),
        (["--prompt-file", "missing.txt"], "--prompt-file 'missing.txt' is not a file"),
        (["--prompt-file", "DATA", "--prompt-tokens", "0"], "--prompt-tokens must be >= 1"),
        (["--prompt-file", "DATA", "--num-prompts", "200", "--prompt-val-every", "2"],
         r"--num-prompts 200: .* only \d+ prompts"),
    ],
)  # fmt: skip
def test_bad_arguments_fail_before_any_engine(data, monkeypatch, capsys, extra, match) -> None:
    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was built before the arguments were checked")

    monkeypatch.setattr(spec_decode, "build_llm", no_engine)
    extra = [str(data[0]) if x == "DATA" else x for x in extra]
    argv = ["bench", "spec", "--model", str(demo_model_path()), *SMALL, *extra]
    assert main(argv) != 0
    assert re.search(f"error: {match}", capsys.readouterr().err)
