# Written from core's enum tables by `go generate ./core`; TestEnumsAgree
# (core/enum_test.go) checks that it is, and checks the tables against
# include/symmem.h (Note [Enum tables] in core/enum.go). Do not edit by hand.
"""The enums of include/symmem.h, with the names Python uses for them."""

import enum


class Result(enum.IntEnum):
    """``enum symmem_result``; the values are fixed by the C ABI."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    OUT_OF_MEMORY = 2
    INVALID_POINTER = 3
    INVALID_DEVICE = 4
    BACKEND = 5
    UNAVAILABLE = 6
    TIMEOUT = 7
    MISMATCH = 8
    PEER = 9
    PERMISSION = 10
    INVALID_STATE = 11
    INTERNAL = 12
    ABORTED = 13
    INTERRUPTED = 14


#: ``enum symmem_dtype`` by name.
DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2, "int32": 3}

#: The size in bytes of an element of each dtype, by value.
DTYPE_SIZES = {0: 4, 1: 2, 2: 2, 3: 4}

#: ``enum symmem_op`` by name.
OPS = {"sum": 0, "max": 1, "min": 2}

#: ``enum symmem_coll`` by name.
COLLECTIVES = {"all_reduce": 0, "all_gather": 1, "reduce_scatter": 2, "all_to_all": 3}

#: ``enum symmem_algo`` by name.
ALGOS = {"auto": 0, "one_shot": 1, "two_shot": 2, "hierarchical": 3, "nccl": 4, "low_latency": 5, "copy_engine": 6}
