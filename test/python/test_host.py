"""expanse.host: pinned host memory from Python, on the sim's HOST_NUMA pages."""
import ctypes
import gc

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


# ---- DLPack and tensors ------------------------------------------------------------------------

def _capi(name, restype, *argtypes):
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_get_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_set_name = _capi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_get_name = _capi("PyCapsule_GetName", ctypes.c_char_p, ctypes.py_object)
_USED = b"used_dltensor"


def consume(capsule):
    """What a DLPack consumer does: takes the tensor, renames the capsule, owns the deleter."""
    assert _get_name(capsule) == b"dltensor"
    managed = _get_pointer(capsule, b"dltensor")
    _set_name(capsule, _USED)
    return expanse.host._DLManagedTensor.from_address(managed), managed


def test_a_dlpack_consumer_gets_the_exact_block_and_frees_it(ex):
    buf = expanse.host.buffer(3 * MiB + 7)
    assert buf.__dlpack_device__() == (1, 0)
    t, managed = consume(buf.__dlpack__())
    assert t.data == buf.ptr and t.ndim == 1 and t.device_type == 1
    assert ctypes.c_int64.from_address(t.shape).value == 3 * MiB + 7
    with pytest.raises(BufferError, match="handed to a consumer already"):
        buf.__dlpack__()
    with pytest.raises(BufferError, match="handed to a consumer already"):
        buf.__dlpack__(copy=True)  # the consumer may have freed what a copy would read
    del buf  # the consumer owns the block now
    assert expanse.host.stats()["live_blocks"] == 1
    t.deleter(managed)  # the consumer's last reference
    s = expanse.host.stats()
    assert s["live_blocks"] == 0 and s["num_frees"] == 1


def test_a_buffer_or_capsule_never_consumed_frees_its_block(ex):
    buf = expanse.host.buffer(MiB)
    del buf
    assert expanse.host.stats()["live_blocks"] == 0
    buf = expanse.host.buffer(MiB)
    cap = buf.__dlpack__()
    del cap  # dropped unconsumed: the buffer settles it
    assert expanse.host.stats()["live_blocks"] == 1
    del buf
    assert expanse.host.stats()["live_blocks"] == 0


def test_a_capsule_kept_past_its_buffer_stays_valid_for_its_consumer(ex):
    buf = expanse.host.buffer(MiB)
    ctypes.memset(buf.ptr, 0x6e, MiB)
    cap = buf.__dlpack__()
    del buf  # the capsule, still unconsumed, is held elsewhere: the block must stay
    assert expanse.host.stats()["live_blocks"] == 1
    t, managed = consume(cap)
    assert ctypes.string_at(t.data + MiB - 1, 1) == b"\x6e"
    t.deleter(managed)
    assert expanse.host.stats()["live_blocks"] == 0


def test_a_copy_asked_of_a_buffer_is_a_block_of_its_own(ex):
    buf = expanse.host.buffer(4096)
    ctypes.memset(buf.ptr, 0x21, 4096)
    t, managed = consume(buf.__dlpack__(copy=True))
    assert t.data != buf.ptr and ctypes.string_at(t.data, 1) == b"\x21"
    t.deleter(managed)
    del buf
    assert expanse.host.stats()["live_blocks"] == 0


def test_a_buffer_refuses_a_device_or_a_copy(ex):
    buf = expanse.host.buffer(MiB)
    with pytest.raises(BufferError, match="host memory"):
        buf.__dlpack__(dl_device=(2, 0))
    with pytest.raises(ValueError, match="device 5"):
        expanse.host.buffer(MiB, device=5)
    del buf
    gc.collect()
    assert expanse.host.stats()["live_blocks"] == 0


def test_freeing_after_the_device_keeps_the_pinned_memory_to_one_block(ex):
    for _ in range(6):
        p = expanse.host.malloc(6 * MiB)
        expanse.host.free_after_device(p)
    s = expanse.host.stats()
    assert s["peak_pinned_bytes"] <= 12 * MiB
    assert s["num_waits"] >= 4  # each request that found only such memory synchronized
    with pytest.raises(expanse.ExpanseError, match="freed already|not memory"):
        expanse.host.free_after_device(p)


def test_a_pinned_torch_tensor_is_exact_and_its_deleter_frees_it(ex):
    torch = pytest.importorskip("torch")
    t = expanse.host.empty((1000, 3), torch.float32)
    assert t.shape == (1000, 3) and t.dtype == torch.float32 and t.device.type == "cpu"
    t.fill_(2.5)
    assert t.sum().item() == 7500.0
    s = expanse.host.stats()
    assert s["requested_bytes"] == 12000 and s["live_blocks"] == 1
    view = t[10:]
    del t
    assert expanse.host.stats()["live_blocks"] == 1, "a view keeps the block"
    assert view[0, 0].item() == 2.5
    del view
    assert expanse.host.stats()["live_blocks"] == 0
    big = expanse.host.empty(20 * MiB + 1, torch.uint8)
    assert expanse.host.stats()["allocated_bytes"] == 22 * MiB  # a power of two: 32
    del big
    assert expanse.host.empty((0, 4)).shape == (0, 4)


def test_a_torch_tensor_with_named_streams_waits_for_those_alone(ex):
    torch = pytest.importorskip("torch")
    t = expanse.host.empty(4 * MiB, torch.uint8, streams=[0])
    del t
    u = expanse.host.empty(4 * MiB, torch.uint8)
    assert expanse.host.stats()["num_waits"] == 0, "named streams: no synchronize"
    del u
