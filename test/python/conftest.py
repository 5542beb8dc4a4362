"""Shared setup: the package from python/, libexpanse from EXPANSE_LIBRARY (ctest sets both),
and a fresh 1 GiB sim device for every test."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import expanse  # noqa: E402

SIM = "driver:sim,sim_capacity:1GiB"
MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def ex():
    expanse.init(SIM)
    expanse.record_history(False)
    yield expanse
    expanse.record_history(False)
    live = expanse.memory_stats(0)["allocation.all.current"]
    assert live == 0, f"the test left {live} blocks live"


@pytest.fixture
def lib(ex):
    return expanse.library()
