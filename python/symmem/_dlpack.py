"""DLPack capsules for raw memory, built with ctypes (no torch, no numpy).

:func:`capsule` wraps ``nbytes`` at an address as a 1-D uint8 DLPack tensor
on an explicit device, holding a Python ``owner`` object alive until the
consumer (e.g. ``torch.from_dlpack``) calls the deleter.

Why DLPack rather than ``__cuda_array_interface__`` for torch: torch finds the
device of a CUDA-array-interface pointer by asking the driver about it,
while a DLPack tensor names its device. A peer's memory mapped into this
process is addressed through our device, and that is the device the tensor
must have.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p
from typing import Any, Dict, Tuple

__all__ = ["KDL_CPU", "KDL_CUDA", "capsule", "live_count"]

KDL_CPU = 1
KDL_CUDA = 2
_KDL_UINT = 1


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class DLManagedTensor(Structure):
    pass


_DELETER = CFUNCTYPE(None, c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", _DELETER)]

# key -> (the struct, its shape array, the owner); alive until the deleter.
_live: Dict[int, Tuple[Any, Any, Any]] = {}
_lock = threading.Lock()
_ids = itertools.count(1)


def _delete(mt_addr: int) -> None:
    try:
        mt = DLManagedTensor.from_address(mt_addr)
        key = int(mt.manager_ctx or 0)
        with _lock:
            _live.pop(key, None)
    except Exception:  # pragma: no cover - called from C, possibly at shutdown
        pass


_deleter = _DELETER(_delete)
# The deleter may run during interpreter shutdown (a tensor collected late):
# keep the callback object alive for the life of the process.
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_deleter))

_CAPSULE_NAME = b"dltensor"  # a module constant: the capsule keeps its pointer
_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [c_void_p, c_char_p, c_void_p]


def capsule(ptr: int, nbytes: int, device_type: int, device_id: int, owner: Any) -> Any:
    """A "dltensor" PyCapsule: nbytes of uint8 at ptr on (device_type, id).

    owner stays referenced until the consumer's tensor dies. The capsule must
    be consumed (an unconsumed one keeps owner alive for good).
    """
    shape = (c_int64 * 1)(nbytes)
    mt = DLManagedTensor()
    mt.dl_tensor.data = ptr or None
    mt.dl_tensor.device = DLDevice(device_type, device_id)
    mt.dl_tensor.ndim = 1
    mt.dl_tensor.dtype = DLDataType(_KDL_UINT, 8, 1)
    mt.dl_tensor.shape = shape
    mt.dl_tensor.strides = None
    mt.dl_tensor.byte_offset = 0
    key = next(_ids)
    mt.manager_ctx = key
    mt.deleter = _deleter
    with _lock:
        _live[key] = (mt, shape, owner)
    return _PyCapsule_New(ctypes.addressof(mt), _CAPSULE_NAME, None)


def live_count() -> int:
    """How many capsules' owners are still held (for tests)."""
    with _lock:
        return len(_live)
