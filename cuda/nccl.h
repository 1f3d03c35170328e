/*
 * nccl.h - the few NCCL functions libsymmem calls, declared by hand (no NCCL
 * headers at build time), and the trampolines Go calls them through. NCCL is
 * found and opened at run time by dynlib.go and its table filled by
 * Library.Resolve in SM_NCCL_FUNCTIONS order; nothing links it, and a process
 * that never creates an NCCL group never loads it.
 *
 * Types and values are nccl.h's (NCCL 2.28): ncclResult_t is an int enum,
 * ncclComm_t and ncclWindow_t are opaque pointers, ncclUint8 is 1,
 * NCCL_WIN_COLL_SYMMETRIC is 0x01. Handles cross into Go as uintptr_t.
 */
#ifndef SYMMEM_CUDA_NCCL_H
#define SYMMEM_CUDA_NCCL_H

#include <stddef.h>
#include <stdint.h>

typedef int sm_ncclResult_t;
typedef struct sm_ncclComm *sm_ncclComm_t;
typedef struct sm_ncclWindow *sm_ncclWindow_t;
typedef struct CUstream_st *sm_cudaStream_t;

#define SM_NCCL_SUCCESS 0
#define SM_NCCL_UINT8 1
#define SM_NCCL_WIN_COLL_SYMMETRIC 0x01

/* X(name, return type, (parameters)), in table order. The version that
 * introduced each is in nccl.go (ncclSymbols), which must list them in the
 * same order. */
#define SM_NCCL_FUNCTIONS(X)                                                                 \
  X(ncclGetVersion, sm_ncclResult_t, (int *version))                                        \
  X(ncclGetErrorString, const char *, (sm_ncclResult_t result))                             \
  X(ncclGetLastError, const char *, (sm_ncclComm_t comm))                                   \
  X(ncclCommUserRank, sm_ncclResult_t, (sm_ncclComm_t comm, int *rank))                     \
  X(ncclCommCount, sm_ncclResult_t, (sm_ncclComm_t comm, int *count))                       \
  X(ncclCommCuDevice, sm_ncclResult_t, (sm_ncclComm_t comm, int *device))                   \
  X(ncclAllGather, sm_ncclResult_t,                                                         \
    (const void *sendbuff, void *recvbuff, size_t sendcount, int datatype,                  \
     sm_ncclComm_t comm, sm_cudaStream_t stream))                                           \
  X(ncclCommWindowRegister, sm_ncclResult_t,                                                \
    (sm_ncclComm_t comm, void *buff, size_t size, sm_ncclWindow_t *win, int winFlags))      \
  X(ncclCommWindowDeregister, sm_ncclResult_t, (sm_ncclComm_t comm, sm_ncclWindow_t win))   \
  X(ncclGetPeerDevicePointer, sm_ncclResult_t,                                              \
    (sm_ncclWindow_t window, size_t offset, int peer, void **outPtr))

typedef struct smnc_table {
#define SMNC_FIELD(name, ret, params) ret(*name) params;
  SM_NCCL_FUNCTIONS(SMNC_FIELD)
#undef SMNC_FIELD
} smnc_table;

/* The symbol names in table order and their number. */
extern const char *const smnc_symbol_names[];
extern const int smnc_symbol_count;

/* Publishes a resolved table (smnc_symbol_count pointers; optional ones may
 * be NULL). Called once, under the Go side's lock. */
void smnc_install(const void *ptrs);

/* Whether the optional ncclGetPeerDevicePointer is there (NCCL >= 2.29). */
int smnc_has_peer_pointer(void);

/* Trampolines; each returns an ncclResult_t. Those taking ctx make that
 * CUDA context (the device's primary context; 0: none, no driver loaded)
 * current around the call, as shim.h's trampolines do: the Go side calls
 * them from whatever OS thread its goroutine runs on. */
int smnc_get_version(int *version);
const char *smnc_error_string(int res);
const char *smnc_last_error(uintptr_t comm);
int smnc_comm_user_rank(uintptr_t comm, int *rank);
int smnc_comm_count(uintptr_t comm, int *count);
int smnc_comm_cu_device(uintptr_t comm, int *device);
int smnc_all_gather(uintptr_t ctx, uintptr_t comm, uintptr_t stream, unsigned long long send,
                    unsigned long long recv, size_t bytes);
int smnc_window_register(uintptr_t ctx, uintptr_t comm, unsigned long long addr, size_t size, uintptr_t *win);
int smnc_window_deregister(uintptr_t ctx, uintptr_t comm, uintptr_t win);
int smnc_peer_pointer(uintptr_t ctx, uintptr_t win, size_t offset, int peer, unsigned long long *ptr);

#endif /* SYMMEM_CUDA_NCCL_H */
