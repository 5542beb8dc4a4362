"""expanse.host: pinned host memory from Python, on the sim's HOST_NUMA pages."""
import ctypes

import pytest

import expanse
from conftest import MiB


def test_a_pinned_block_is_exact_and_its_bytes_stay(ex):
    expanse.init("driver:sim,sim_capacity:1GiB,sim_host_capacity:512MiB")
    p = expanse.host.malloc(20 * MiB + 1)
    ctypes.memset(p, 0x3C, 20 * MiB + 1)
    s = expanse.host.stats()
    assert s["path"] == "vmm"
    assert s["pinned_bytes"] == 22 * MiB  # to the 2 MiB granularity; a power of two pins 32
    assert s["requested_bytes"] == 20 * MiB + 1
    assert ctypes.string_at(p + 20 * MiB, 1) == b"\x3c"
    expanse.host.free(p)
    expanse.host.empty_cache()
    assert expanse.host.stats()["pinned_bytes"] == 0


def test_misuse_raises_naming_the_pointer(ex):
    p = expanse.host.malloc(MiB)
    with pytest.raises(expanse.ExpanseError, match="interior pointer"):
        expanse.host.free(p + 4096)
    with pytest.raises(expanse.ExpanseError, match="NUMA node -4"):
        expanse.host.malloc(MiB, numa_node=-4)
    expanse.host.free(p)
    with pytest.raises(expanse.ExpanseError, match="freed already"):
        expanse.host.free(p)


def test_the_limit_holds_and_says_so(ex):
    expanse.host.set_limit(8 * MiB)
    p = expanse.host.malloc(6 * MiB)
    with pytest.raises(expanse.ExpanseError, match="out of memory|no more pages"):
        expanse.host.malloc(4 * MiB)
    expanse.host.free(p)
    q = expanse.host.malloc(8 * MiB)  # the freed pages serve it
    assert expanse.host.stats()["limit_bytes"] == 8 * MiB
    expanse.host.free(q)
    expanse.host.set_limit(None)
    assert expanse.host.stats()["limit_bytes"] is None


def test_without_host_vmm_the_fallback_says_what_it_is(ex):
    expanse.init("driver:sim,sim_capacity:1GiB,sim_host_numa:false")
    p = expanse.host.malloc(3 * MiB + 1)
    s = expanse.host.stats()
    assert s["path"] == "registered"
    assert s["pinned_bytes"] == 3 * MiB + 4096
    expanse.host.free(p)
