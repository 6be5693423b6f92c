"""``bench throughput --repeats``: the spread of repeated timed runs and each run's host
figures, on the CPU through the real ``LLM`` (structure and bounds only, no timings)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from minivllm.benchmarks.throughput_repeats import (
    GcPauses,
    HostBusy,
    _other_threads,
    minor_page_faults,
    page_faults_since,
    run_repeats,
    thread_cpu_seconds,
)
from minivllm.benchmarks.workloads import Workload
from minivllm.cli import main

WORKLOAD = Workload(prompts=[[5, 6, 7, 8, 9], [10] * 9, [11, 12, 13]], output_lens=[3, 6, 2])


def test_repeats_time_every_run_and_put_the_engine_back(llm) -> None:
    engine = llm.llm_engine
    runner = engine.engine_core.engine_core.model_executor.model_runner
    out = run_repeats(llm, WORKLOAD, 2, max_tokens_per_s=1e6)
    assert len(out["runs"]) == 2 and out["temperature"] == 0.6
    for run in out["runs"]:
        # The step loop's time minus its waits: within the run, never negative.
        assert 0.0 <= run["host_busy_s"] <= run["seconds"]
        assert run["host_wait_s"] >= 0.0
        assert run["output_tokens_per_s"] == pytest.approx(
            WORKLOAD.num_output_tokens / run["seconds"]
        )
        assert run["fraction_of_roofline"] == pytest.approx(run["output_tokens_per_s"] / 1e6)
        if os.path.isdir("/proc/self/task"):
            assert run["other_threads_cpu_s"] >= 0.0
        assert 0.0 <= run["gc_s"] <= run["seconds"] and len(run["gc_collections"]) == 3
        assert run["minor_page_faults"] is None or run["minor_page_faults"] >= 0
    assert out["min_s"] <= out["median_s"] <= out["max_s"]
    assert out["best_fraction_of_roofline"] >= out["worst_fraction_of_roofline"]
    assert "step" not in vars(engine) and "execute_model_async" not in vars(runner)
    json.dumps(out)


def test_page_faults_count_memory_touched_for_the_first_time() -> None:
    if minor_page_faults() is None:
        pytest.skip("no resource module here")
    page, size = os.sysconf("SC_PAGE_SIZE"), 64 << 20
    before = minor_page_faults()
    block = bytearray(size)
    block[::page] = b"\1" * (size // page)  # write one byte to every page: each is touched
    assert page_faults_since(before) >= size // page // 2
    del block
    assert page_faults_since(None) is None


def test_host_busy_subtracts_the_waits(llm) -> None:
    with HostBusy(llm) as busy:
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], use_tqdm=False)
    assert busy.step_s > 0.0 and 0.0 <= busy.wait_s <= busy.step_s
    assert busy.busy_s == pytest.approx(busy.step_s - busy.wait_s)


def test_gc_pauses_count_collections_by_generation_and_detach() -> None:
    import gc

    with GcPauses() as pauses:
        gc.collect()  # one full collection: the oldest generation, 2
        gc.collect(0)
    assert pauses.collections == [1, 0, 1]
    assert pauses.seconds > 0.0
    assert pauses._callback not in gc.callbacks
    gc.collect()
    assert pauses.collections == [1, 0, 1]  # nothing counted after the block


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_a_spinning_thread_shows_up_as_other_threads_cpu() -> None:
    before = thread_cpu_seconds()
    assert os.getpid() in before  # the main thread's id is the process id

    # Sampled while the thread still spins: an ended thread has left /proc.
    done = threading.Event()

    def spin_until_done() -> None:
        while not done.is_set():
            pass

    spinner = threading.Thread(target=spin_until_done)
    spinner.start()
    time.sleep(0.4)
    after = thread_cpu_seconds()
    done.set()
    spinner.join()
    assert _other_threads(before, after) >= 0.1
    assert _other_threads(None, after) is None


def test_bad_repeats_fail_before_anything_loads(tmp_path, capsys) -> None:
    # The model folder does not exist: the check must come first.
    code = main(["bench", "throughput", "--allow-cpu", "--repeats", "-1",
                 "--model", str(tmp_path / "none")])  # fmt: skip
    assert code == 2
    assert "--repeats must be >= 0, got -1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--repeats must be >= 1"):
        run_repeats(None, WORKLOAD, 0)
