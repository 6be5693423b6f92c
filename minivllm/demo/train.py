"""Train the demo model: a byte-level BPE tokenizer and a tiny Llama on one text file.

    python -m minivllm.demo.train --data kjv.txt --out minivllm/demo/model --seed 0

``--data`` is plain text, one passage per line (the packaged model used the King James
Bible, one verse per line, as printed by Debian's ``bible -f Gen1:1-Rev22:21``; a leading
verse reference such as ``Ge1:1`` is stripped). Every passage is followed by the
end-of-sequence token, so the model learns to stop at the end of a verse and a demo
prompt finishes with ``finish_reason="stop"``.

``--tokenizer DIR`` reuses a tokenizer instead of training one: a smaller model trained
with ``--tokenizer minivllm/demo/model`` shares the demo model's vocabulary, so it can be
its draft model for speculative decoding (``docs/spec_decode.md``).

Everything that decides the result is an argument and is recorded in ``training_log.json``
beside the checkpoint: the seed fixes the initial weights and the order of the batches
(drawn on the CPU, so it is the same on any device), the tokenizer training is
deterministic, and deterministic kernels are requested. The model is transformers' own
``LlamaForCausalLM``, so the folder loads in transformers and in minivllm unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from minivllm.demo.tokenizer import train_byte_level_tokenizer

# "Ge1:1 ", "1Co13:4 ", "Song2:1 ": the reference `bible -f` prints before each verse.
_VERSE_REF = re.compile(r"^[1-3]?[A-Za-z]+\d+:\d+\s+")
SAMPLE_PROMPTS = ("In the beginning", "And God said", "The LORD is my shepherd", "Blessed are")


def build_arg_parser() -> argparse.ArgumentParser:
    """Arguments of the training script; their defaults made the packaged model."""
    p = argparse.ArgumentParser(prog="python -m minivllm.demo.train", description=__doc__)
    p.add_argument("--data", required=True, help="UTF-8 text file, one passage per line")
    p.add_argument("--out", required=True, help="output folder (a Hugging Face checkpoint)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument(
        "--tokenizer",
        default=None,
        help="reuse the tokenizer in this folder instead of training one (e.g. the demo "
        "model's, so that the result can draft for it); --vocab-size is then its size",
    )
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=6)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=704)
    p.add_argument("--seq-len", type=int, default=512, help="training window in tokens")
    p.add_argument("--batch-size", type=int, default=32, help="windows per step")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr")
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--val-every", type=int, default=50, help="every Nth block of 100 lines")
    p.add_argument("--eval-every", type=int, default=100, help="steps between val evals")
    p.add_argument("--log-every", type=int, default=10, help="steps per loss-curve point")
    p.add_argument("--sample-tokens", type=int, default=40, help="length of logged samples")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument(
        "--train-eos-embedding",
        action="store_true",
        help="learn the end-of-sequence token's embedding (by default, as the demo model "
        "was made, it is the padding row and stays zero; deep models need it learned)",
    )
    return p


def _check_args(args: argparse.Namespace) -> None:
    if not os.path.isfile(args.data):
        raise FileNotFoundError(f"--data {args.data!r} is not a file")
    for name in ("steps", "batch_size", "seq_len", "num_layers", "eval_every", "log_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.tokenizer is not None and not os.path.isfile(
        os.path.join(args.tokenizer, "tokenizer.json")
    ):
        raise FileNotFoundError(f"--tokenizer {args.tokenizer!r} holds no tokenizer.json")
    if args.num_heads % args.num_kv_heads or args.hidden_size % args.num_heads:
        raise ValueError(
            "--num-heads must divide --hidden-size and be a multiple of --num-kv-heads"
        )


def read_passages(path: str) -> list[str]:
    """The non-empty lines of ``path``, each without a leading verse reference."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    passages = [_VERSE_REF.sub("", line).strip() for line in lines]
    passages = [p for p in passages if p]
    if not passages:
        raise ValueError(f"--data {path!r} has no text")
    return passages


def split_passages(passages: list[str], val_every: int) -> tuple[list[str], list[str]]:
    """Hold out every ``val_every``-th block of 100 consecutive passages for validation.

    Whole blocks, not single lines, so a validation verse's neighbours are not in the
    training set and the validation loss measures more than recall of adjacent text.
    """
    train, val = [], []
    for i, text in enumerate(passages):
        (val if (i // 100) % val_every == val_every - 1 else train).append(text)
    return train, val


def encode_stream(tokenizer: Any, passages: list[str]) -> torch.Tensor:
    """One long token stream: each passage's ids followed by the end-of-sequence id."""
    ids: list[int] = []
    for enc in tokenizer(passages, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def build_model(args: argparse.Namespace, tokenizer: Any) -> Any:
    """A freshly initialized ``LlamaForCausalLM`` (float32) seeded by ``args.seed``."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        max_position_embeddings=args.seq_len,
        tie_word_embeddings=True,  # saves a second 4096 x 256 matrix: 1M weights, +19%
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        # The pad id is the eos id, so transformers makes the eos row the embedding's
        # padding row: zero, never trained. A window that starts with eos then carries an
        # all-zero residual stream through every layer, and each RMSNorm's backward at
        # zero scales the gradient by 1/sqrt(eps); past about 20 layers it overflows to
        # NaN in the first step. --train-eos-embedding builds the model without the
        # padding row (the saved config still names the pad id).
        pad_token_id=None if args.train_eos_embedding else tokenizer.pad_token_id,
    )
    torch.manual_seed(args.seed)
    # Eager attention: its backward is deterministic, and at 512 tokens it is cheap.
    model = transformers.LlamaForCausalLM(config)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.set_attn_implementation("eager")
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> Any:
    """AdamW with warmup then cosine decay to ``min_lr_ratio``; no decay on norm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def factor(step: int) -> float:
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        progress = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def sample_batch(stream: torch.Tensor, gen: torch.Generator, batch: int, seq_len: int):
    """``batch`` random windows of ``seq_len + 1`` tokens (inputs and shifted targets).

    Offsets come from a CPU generator, so the data order depends on the seed alone.
    """
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
    windows = torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, amp: bool) -> torch.Tensor:
    """Mean next-token cross-entropy of ``model`` on inputs ``x`` and targets ``y``."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


@torch.no_grad()
def evaluate(model: torch.nn.Module, stream: torch.Tensor, args, device, amp: bool) -> float:
    """Validation loss over up to 64 non-overlapping windows at fixed offsets."""
    model.eval()
    n = min(64, (len(stream) - 1) // args.seq_len)
    starts = [i * args.seq_len for i in range(n)]
    windows = torch.stack([stream[s : s + args.seq_len + 1] for s in starts]).to(device)
    losses = [
        lm_loss(model, w[:, :-1], w[:, 1:], amp).item() for w in windows.split(args.batch_size)
    ]
    model.train()
    return float(sum(losses) / len(losses))


@torch.no_grad()
def greedy_samples(model: Any, tokenizer: Any, device, max_new_tokens: int = 40) -> dict:
    """Greedy continuations of ``SAMPLE_PROMPTS`` (recorded in the training log)."""
    model.eval()
    out = {}
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt)], device=device)
        gen = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
        )
        out[prompt] = tokenizer.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
    model.train()
    return out


def train(args: argparse.Namespace, model, train_ids, val_ids, device, amp: bool) -> dict:
    """The training loop; returns the loss curve and the validation evaluations."""
    opt, sched = make_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed)
    curve, evals, window = [], [], []
    model.train()
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = sample_batch(train_ids, gen, args.batch_size, args.seq_len)
        loss = lm_loss(model, x.to(device), y.to(device), amp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        sched.step()
        window.append(loss.detach())
        if step % args.log_every == 0 or step == args.steps:
            mean = torch.stack(window).mean().item()  # one host sync per log point
            curve.append({"step": step, "loss": round(mean, 5), "lr": sched.get_last_lr()[0]})
            window = []
        if step % args.eval_every == 0 or step == args.steps:
            val = evaluate(model, val_ids, args, device, amp)
            evals.append({"step": step, "val_loss": round(val, 5)})
            print(
                f"step {step:5d}  train {loss.item():.4f}  val {val:.4f}  "
                f"{time.perf_counter() - t0:6.1f}s",
                flush=True,
            )
    return {"loss_curve": curve, "eval": evals, "train_seconds": time.perf_counter() - t0}


# A plain role-marker template ("### User:\n...\n\n### Assistant:\n"). The model was never
# trained on chats, so it answers in scripture, but the whole chat path runs on it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '### ' + message['role'] | capitalize + ':\\n' + message['content'] + '\\n\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant:\\n' }}{% endif %}"
)


def save_checkpoint(model: Any, tokenizer: Any, out: Path) -> None:
    """Write the Hugging Face folder: config, generation config, weights, tokenizer."""
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # transformers 5 records its new class name; the old one loads in versions 4 and 5.
    cfg_file = out / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE  # so LLM.chat and /v1/chat/completions work
    cfg_file.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    special = {
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    for f in out.iterdir():
        f.chmod(0o644)  # safetensors writes 0600; package data must be world-readable


def load_or_train_tokenizer(args: argparse.Namespace, train_text: list[str]) -> Any:
    """The tokenizer of ``--tokenizer`` (checked to have the special tokens training
    relies on), or one trained on ``train_text`` with ``--vocab-size`` ids."""
    if args.tokenizer is None:
        return train_byte_level_tokenizer(train_text, args.vocab_size)
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.tokenizer)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(tokenizer, name) is None:
            raise ValueError(f"--tokenizer {args.tokenizer!r} has no {name}")
    args.vocab_size = len(tokenizer)
    return tokenizer


def _versions(device: torch.device) -> dict:
    import tokenizers
    import transformers

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "device": gpu or "cpu",
    }


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but CUDA is not available")
    return torch.device(name)


def main(argv: Sequence[str] | None = None) -> int:
    """Train and save the checkpoint, tokenizer and ``training_log.json`` into ``--out``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_arg_parser().parse_args(argv)
    _check_args(args)
    # Deterministic kernels; cuBLAS needs this workspace setting before its first use.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = _resolve_device(args.device)
    amp = device.type == "cuda"  # bf16 autocast on the GPU; plain float32 on the CPU

    passages = read_passages(args.data)
    train_text, val_text = split_passages(passages, args.val_every)
    tokenizer = load_or_train_tokenizer(args, train_text)
    train_ids, val_ids = encode_stream(tokenizer, train_text), encode_stream(tokenizer, val_text)
    print(f"{len(passages)} passages, {len(train_ids)} train / {len(val_ids)} val tokens")

    model = build_model(args, tokenizer).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f}M parameters on {device}")
    result = train(args, model, train_ids, val_ids, device, amp)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    samples = greedy_samples(model, tokenizer, device, args.sample_tokens)
    save_checkpoint(model.to(getattr(torch, args.save_dtype)), tokenizer, out)
    data = Path(args.data).read_bytes()
    log = {
        "command": "python -m minivllm.demo.train " + shlex.join(argv),
        "args": vars(args),
        "seed": args.seed,
        "versions": _versions(device),
        "data": {
            "file": Path(args.data).name,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "passages": len(passages),
            "train_tokens": len(train_ids),
            "val_tokens": len(val_ids),
        },
        "tokenizer_sha256": hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest(),
        "tokenizer_source": args.tokenizer or "trained",
        "model_sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(),
        "num_parameters": n_params,
        "steps": args.steps,
        "tokens_seen": args.steps * args.batch_size * args.seq_len,
        "final_train_loss": result["loss_curve"][-1]["loss"],
        "final_val_loss": result["eval"][-1]["val_loss"],
        "samples": samples,
        **result,
    }
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
