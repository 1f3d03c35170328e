"""Argument handling of the collectives (symmem.Handle.all_reduce & co.).

dtype is a name (a key of DTYPES: "float32", "bfloat16", ...), a numpy dtype
(when numpy is importable) or a torch dtype (when torch is); op a name (a
key of OPS: "sum", "max", "min"); algo a name (a key of ALGOS: "auto",
"one_shot", ..., "low_latency", "copy_engine"; "hierarchical" and "nccl"
choose the form on a group that spans machines, docs/machines.md). sm_free=True
is algo "copy_engine": the bytes move through the GPUs' copy engines, leaving
the SMs to the model (docs/speed.md, "Collectives on the copy engines"). The tables come from
_enums.py, written from core's Go tables, which a test checks against
include/symmem.h's enums (Note [Enum tables] in core/enum.go).
"""

from __future__ import annotations

from typing import Optional

from ._enums import ALGOS, COLLECTIVES, DTYPE_SIZES, DTYPES, OPS  # noqa: F401 (DTYPE_SIZES for group.py)
from .errors import C_INT, C_PTR, Result, brief, int_arg, make_error, quote


def _shown(value) -> str:
    """A name the caller passed, for a message: a str quoted (cut at 64
    characters), anything else by its type and a cut repr."""
    return quote(value) if isinstance(value, str) else brief(value)

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = COLLECTIVES["all_reduce"], COLLECTIVES["all_gather"], COLLECTIVES["reduce_scatter"]
ALL_TO_ALL = COLLECTIVES["all_to_all"]

_ALIASES = {"float": "float32", "half": "float16", "fp16": "float16", "fp32": "float32", "bf16": "bfloat16",
            "int": "int32", "i32": "int32", "f32": "float32", "f16": "float16"}


def dtype_code(dtype, what: str) -> int:
    """The symmem_dtype value of dtype (name, numpy or torch dtype)."""
    name = dtype if isinstance(dtype, str) else None
    if name is None:
        # numpy dtypes and scalar types (np.float32, np.dtype("int32")) have
        # .name after np.dtype(); torch dtypes print as "torch.bfloat16".
        try:
            import numpy

            name = numpy.dtype(dtype).name
        except Exception:
            text = str(dtype)
            name = text[len("torch."):] if text.startswith("torch.") else None
    if name is not None:
        name = _ALIASES.get(name, name)
        if name in DTYPES:
            return DTYPES[name]
    raise make_error(
        Result.INVALID_ARGUMENT,
        f"{what}: unknown dtype {_shown(dtype)} (known: {', '.join(DTYPES)}, or their numpy dtypes)",
    )


def op_code(op, what: str) -> int:
    if isinstance(op, str) and op.lower() in OPS:
        return OPS[op.lower()]
    raise make_error(Result.INVALID_ARGUMENT, f"{what}: unknown op {_shown(op)} (known: {', '.join(OPS)})")


def algo_code(algo, what: str) -> int:
    if algo is None:
        return 0
    if isinstance(algo, str) and algo.lower().replace("-", "_") in ALGOS:
        return ALGOS[algo.lower().replace("-", "_")]
    raise make_error(Result.INVALID_ARGUMENT, f"{what}: unknown algo {_shown(algo)} (known: {', '.join(ALGOS)})")


def sm_free_algo(algo, sm_free, what: str):
    """The algo of a call with sm_free: "copy_engine" when sm_free is true
    (an algo that says otherwise is refused), algo itself when false."""
    if not isinstance(sm_free, bool):
        raise make_error(Result.INVALID_ARGUMENT, f"{what}: sm_free must be True or False, got {brief(sm_free)}")
    if not sm_free:
        return algo
    if algo is not None and (not isinstance(algo, str) or algo.lower().replace("-", "_") not in ("auto", "copy_engine")):
        raise make_error(
            Result.INVALID_ARGUMENT,
            f"{what}: sm_free=True runs the call on the copy engines (algo \"copy_engine\"), but algo is {_shown(algo)}",
        )
    return "copy_engine"


def address(out, what: str, name: str = "out") -> Optional[int]:
    """out (the argument called name) as an address: None, an int, a Buffer
    (.ptr) or a tensor (.data_ptr())."""
    if out is None:
        return None
    if isinstance(out, int) and not isinstance(out, bool):
        return int_arg(out, name, what, C_PTR)
    ptr = getattr(out, "ptr", None)
    if isinstance(ptr, int):
        return int_arg(ptr, name, what, C_PTR)
    data_ptr = getattr(out, "data_ptr", None)
    if callable(data_ptr):
        return int_arg(data_ptr(), name, what, C_PTR)
    raise make_error(
        Result.INVALID_ARGUMENT, f"{what}: {name} must be None, an int address or a Buffer, got {type(out).__name__}"
    )


def collectives_load(device: int = 0) -> dict:
    """Compile (or read from the disk cache) and load the collectives'
    kernels for device now; returns how: arch, from_cache, compile_ms,
    load_ms, compiler, cache_path (all zero/empty on the host backend)."""
    import ctypes

    from . import _lib
    from ._lib import check

    device = int_arg(device, "device", "symmem.collectives_load", C_INT)
    info = _lib.SymmemKernelInfo()
    check(_lib.lib().symmem_collectives_load(device, ctypes.byref(info)), "symmem_collectives_load")
    return {
        "arch": info.arch,
        "from_cache": bool(info.from_cache),
        "compile_ms": info.compile_ms,
        "load_ms": info.load_ms,
        "compiler": info.compiler.decode(errors="replace"),
        "cache_path": info.cache_path.decode(errors="replace"),
    }
