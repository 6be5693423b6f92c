"""``minivllm trace``: run a small workload under the tracer and save its pictures.

The defaults are chosen to make every mechanism visible in one run on a CPU: prompts
that share a long prefix (prefix caching), a small token budget (chunked prefill), and
a KV pool too small for every request at once (preemption). Any engine argument can be
changed on the command line, exactly as for ``minivllm generate``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# A shared opening (prefix caching) and eight different continuations of different length.
SHARED_PREFIX = (
    "In the beginning God created the heaven and the earth. And the earth was without "
    "form, and void; and darkness was upon the face of the deep. "
)
CONTINUATIONS = (
    "And God said,",
    "And the evening and the morning were the first day. And",
    "And the Spirit of God moved upon the face of the waters, and",
    "Then",
)
STANDALONE = (
    "The LORD is my shepherd;",
    "Blessed are the poor in spirit: for",
    "And it came to pass in those days, that",
    "Let there be",
)

# Engine defaults of this command (overridable): small enough to preempt and to chunk.
TRACE_ENGINE_DEFAULTS = dict(
    block_size=8,
    num_kv_blocks=32,
    max_num_batched_tokens=48,
    max_model_len=256,
    max_num_seqs=8,
    device="cpu",
)


def default_prompts() -> list[str]:
    """The command's default workload: four prompts with a shared prefix, four without."""
    return [SHARED_PREFIX + c for c in CONTINUATIONS] + list(STANDALONE)


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``minivllm trace`` besides the engine arguments."""
    parser.add_argument("prompts", nargs="*", help="prompt texts (default: a built-in mix)")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--out-dir", default="trace", help="folder for the pictures and JSON")


def set_trace_engine_defaults(parser: argparse.ArgumentParser) -> None:
    """Replace the engine-argument defaults with :data:`TRACE_ENGINE_DEFAULTS`."""
    parser.set_defaults(**TRACE_ENGINE_DEFAULTS)


def run_trace(ns: argparse.Namespace) -> int:
    """Run the prompts with a tracer attached; write timeline, KV usage, block table."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window

    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.llm import LLM
    from minivllm.sampling_params import SamplingParams
    from minivllm.tracing.plots import save_trace_figures
    from minivllm.tracing.tracer import trace

    if ns.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {ns.max_tokens}")
    if ns.model is None:
        from minivllm.demo import demo_model_path

        ns.model = str(demo_model_path())
    llm = LLM(**vars(EngineArgs.from_cli_args(ns)))
    if ns.prompts:
        prompts: list = list(ns.prompts)
    elif llm.get_tokenizer() is not None:
        prompts = default_prompts()
    else:
        # No tokenizer: token-id prompts with the same shape (a shared prefix).
        prefix = list(range(10, 42))
        prompts = [{"prompt_token_ids": prefix + list(range(100 + 7 * i, 103 + 9 * i))}
                   for i in range(4)]
        prompts += [{"prompt_token_ids": list(range(200 + 13 * i, 205 + 15 * i))}
                    for i in range(4)]
    params = SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature,
                            ignore_eos=True)
    with trace(llm) as tracer:
        llm.generate(prompts, params, use_tqdm=False)
    print(tracer.summary())
    tokenizer = llm.get_tokenizer()
    decode = None if tokenizer is None else (lambda token: tokenizer.decode([token]))
    for path in save_trace_figures(tracer, Path(ns.out_dir), decode):
        print(f"wrote {path}")
    return 0
