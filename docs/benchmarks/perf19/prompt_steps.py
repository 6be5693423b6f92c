"""The throughput workload's prompt steps as attention batches: [(cached, new), ...] per
step, decodes first (the scheduler lists running requests before new ones), 16,384-token
budget, the last prompt of a step chunked."""
from minivllm.benchmarks.workloads import throughput_workload


def prompt_steps(budget: int = 16384) -> list[list[tuple[int, int]]]:
    w = throughput_workload()
    lens = [len(p) for p in w.prompts]
    done = []  # [prompt_len, generated] of requests past their prompt
    steps, i, partial = [], 0, 0
    while i < len(lens):
        seqs = [(p + g, 1) for p, g in done]
        left = budget - len(seqs)
        new_done = []
        while left > 0 and i < len(lens):
            take = min(left, lens[i] - partial)
            seqs.append((partial, take))
            left -= take
            if partial + take == lens[i]:
                new_done.append([lens[i], 0])
                i, partial = i + 1, 0
            else:
                partial += take
        steps.append(seqs)
        for d in done:
            d[1] += 1
        done += [[p, 1] for p, _ in new_done]
    return steps


if __name__ == "__main__":
    for s in prompt_steps():
        d = sum(1 for c, n in s if n == 1 and c > 0)
        print(len(s), d, sum(n for _, n in s))
