"""Fixtures of the speculative-decoding tests: one intra-op thread, and a target with a
draft cut from it (``test_draft_model.make_target_and_draft``)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one intra-op thread is faster, and far faster on a shared machine
    where a second thread waits for a core (a module of these tests took minutes instead
    of seconds on a loaded 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A two-layer target and its one-layer draft, saved once per module."""
    from tests.spec_decode.test_draft_model import make_target_and_draft

    return make_target_and_draft(tmp_path_factory.mktemp("pair"))
