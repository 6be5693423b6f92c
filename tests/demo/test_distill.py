"""``python -m minivllm.demo.distill``: the target's continuations as demo.train data.

On the shipped demo model (CPU, a few prompts and tokens): the file is one complete
generated passage per line and reads back, through demo.train's own reader and encoder,
as the token stream the target generated; the prompts come from training passages only;
bad arguments fail before any model is loaded, naming the argument.
"""

from __future__ import annotations

import json

import pytest

from minivllm.demo import demo_model_path, distill
from minivllm.demo.passages import split_runs
from minivllm.demo.train import encode_stream, read_passages, split_passages
from tests.demo.test_passages import write_data


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    return transformers.AutoTokenizer.from_pretrained(demo_model_path())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """distill on the demo model: 4 prompts of 40+ tokens, 48 greedy tokens each."""
    folder = tmp_path_factory.mktemp("distill")
    passages = write_data(folder / "data.txt", 400)
    out = folder / "distill.txt"
    argv = ["--model", str(demo_model_path()), "--data", str(folder / "data.txt"),
            "--out", str(out), "--num-prompts", "4", "--prompt-tokens", "40",
            "--max-tokens", "48", "--val-every", "2", "--dtype", "float32",
            "--device", "cpu"]  # fmt: skip
    assert distill.main(argv) == 0
    log = json.loads(distill.log_path(str(out)).read_text())
    return {"out": out, "log": log, "passages": passages}


def test_writes_what_demo_train_reads(run, tokenizer) -> None:
    lines = run["out"].read_text(encoding="utf-8").splitlines()
    assert len(lines) == run["log"]["output"]["lines"] > 0
    assert read_passages(str(run["out"])) == lines  # no line altered or split by the reader
    stream = encode_stream(tokenizer, lines)
    assert len(stream) == run["log"]["output"]["tokens"]
    assert (stream == tokenizer.eos_token_id).sum() == len(lines)


def test_lines_are_the_targets_greedy_continuations(run, tokenizer) -> None:
    """Every line is a passage the demo model generated for one of the prompts."""
    from minivllm import LLM, SamplingParams
    from minivllm.demo.passages import cut_prompts

    passages = run["passages"]
    train_runs, _ = split_runs(len(passages), 2)
    prompts = cut_prompts(tokenizer, passages, train_runs, 4, 40)
    llm = LLM(str(demo_model_path()), dtype="float32", device="cpu", max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p.token_ids} for p in prompts], params)
    expected = []
    for o in outputs:
        pieces, _ = distill.split_at_eos(list(o.outputs[0].token_ids), tokenizer.eos_token_id)
        texts = [tokenizer.decode(p, skip_special_tokens=True) for p in pieces]
        expected += [distill.one_line(t) for t in texts]
    assert run["out"].read_text(encoding="utf-8").splitlines() == [e for e in expected if e]


def test_prompts_come_from_training_passages_only(run) -> None:
    passages = run["passages"]
    train_text, val_text = split_passages(passages, 2)
    log = run["log"]
    assert log["prompts"]["count"] == 4
    assert log["data"]["training_passages"] == len(train_text)
    for first in log["prompts"]["first_passages"]:
        assert passages[first] in train_text and passages[first] not in val_text


def test_log_records_the_target_and_the_command(run) -> None:
    log = run["log"]
    demo_log = json.loads((demo_model_path() / "training_log.json").read_text())
    assert log["target"]["model_sha256"] == demo_log["model_sha256"]
    assert log["target"]["tokenizer_sha256"] == demo_log["tokenizer_sha256"]
    assert log["command"].startswith("python -m minivllm.demo.distill --model ")
    assert log["generation"]["generated_tokens"] == 4 * 48
    out = log["output"]
    assert out["reads_back_identical"] and out["passages_retokenized_identical"] <= out["lines"]
    lines = run["out"].read_text(encoding="utf-8").splitlines()
    assert out["distinct_lines"] == len(set(lines)) <= out["lines"]
    assert {"torch", "transformers", "device"} <= set(log["versions"])


def test_line_breaks_in_generated_text_stay_inside_one_line(tmp_path, tokenizer) -> None:
    eos = tokenizer.eos_token_id
    texts = ["Hello\nworld", "x\r\ny\u2028z\x0bw\x85v", "\n"]  # the last one: empty
    ids = [t for text in texts for t in [*tokenizer.encode(text), eos]]
    ids += tokenizer.encode("a tail cut off")
    out = tmp_path / "d.txt"
    counts = distill.write_passages(out, [ids], tokenizer)
    assert out.read_text(encoding="utf-8").splitlines() == ["Hello world", "x y z w v"]
    assert read_passages(str(out)) == ["Hello world", "x y z w v"]
    assert counts["empty_passages"] == 1 and counts["reads_back_identical"]
    assert counts["tail_tokens_dropped"] == len(tokenizer.encode("a tail cut off"))


def _args(tmp_path, **changes) -> list[str]:
    write_data(tmp_path / "data.txt", 400)
    args = {"--model": str(demo_model_path()), "--data": str(tmp_path / "data.txt"),
            "--out": str(tmp_path / "d.txt"), "--val-every": "2", **changes}  # fmt: skip
    return [x for kv in args.items() for x in kv]


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"--data": "missing.txt"}, FileNotFoundError, "--data 'missing.txt'"),
        ({"--model": "."}, FileNotFoundError, "--model '.': no config.json"),
        ({"--num-prompts": "0"}, ValueError, "--num-prompts must be >= 1"),
        ({"--max-tokens": "0"}, ValueError, "--max-tokens must be >= 1"),
        ({"--temperature": "-0.5"}, ValueError, "--temperature must be >= 0"),
        ({"--out": "/no/such/folder/d.txt"}, ValueError, "--out '/no/such/folder/d.txt'"),
        ({"--num-prompts": "500"}, ValueError, r"--num-prompts 500: .* only \d+ prompts"),
        (
            {"--max-tokens": "600", "--num-prompts": "4"},
            ValueError,
            "--max-tokens 600: .* past the target's 512",
        ),
    ],
)
def test_bad_arguments_fail_before_the_engine(tmp_path, monkeypatch, changes, error, match) -> None:
    def no_engine(*args, **kwargs):
        raise AssertionError("the engine was started before the arguments were checked")

    monkeypatch.setattr(distill, "generate", no_engine)
    with pytest.raises(error, match=match):
        distill.main(_args(tmp_path, **changes))
    assert not (tmp_path / "d.txt").exists()
