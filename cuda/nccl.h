/*
 * nccl.h - the few NCCL functions libsymmem calls, declared by hand (no NCCL
 * headers at build time), and the trampolines Go calls them through. NCCL is
 * found and opened at run time by dynlib.go and its table filled by
 * Library.Resolve in SM_NCCL_FUNCTIONS order; nothing links it, and a process
 * that never creates an NCCL group never loads it.
 *
 * Types and values are nccl.h's: ncclResult_t, ncclDataType_t and
 * ncclRedOp_t are int-sized enums (passed here as int); ncclComm_t and
 * ncclWindow_t are opaque pointers; NCCL_WIN_COLL_SYMMETRIC is 0x01;
 * NCCL_SPLIT_NOCOLOR is -1; ncclCommSplit takes a ncclConfig_t pointer,
 * always NULL here (the new communicator inherits the parent's
 * configuration), so that struct is not declared. Handles cross into Go as
 * uintptr_t.
 *
 * Two structs are declared by hand, with nccl.h's layout:
 *   ncclWaitSignalDesc_t (NCCL 2.29): four ints in this order, 16 bytes:
 *     opCnt (signals to wait for), peer, sigIdx (signal index), ctx;
 *   ncclTeam_t (NCCL's device API): three ints, 12 bytes, returned by value:
 *     nRanks, rank (this rank's index in the team), stride (world ranks of
 *     the team are rank_world + (i - rank) * stride).
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

typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} sm_ncclWaitSignalDesc_t;

typedef struct {
  int nRanks;
  int rank;
  int stride;
} sm_ncclTeam_t;

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
    (sm_ncclWindow_t window, size_t offset, int peer, void **outPtr))                       \
  X(ncclAllReduce, sm_ncclResult_t,                                                         \
    (const void *sendbuff, void *recvbuff, size_t count, int datatype, int op,              \
     sm_ncclComm_t comm, sm_cudaStream_t stream))                                           \
  X(ncclReduceScatter, sm_ncclResult_t,                                                     \
    (const void *sendbuff, void *recvbuff, size_t recvcount, int datatype, int op,          \
     sm_ncclComm_t comm, sm_cudaStream_t stream))                                           \
  X(ncclCommSplit, sm_ncclResult_t,                                                         \
    (sm_ncclComm_t comm, int color, int key, sm_ncclComm_t *newcomm, void *config))         \
  X(ncclCommDestroy, sm_ncclResult_t, (sm_ncclComm_t comm))                                 \
  X(ncclSignal, sm_ncclResult_t,                                                            \
    (int peer, int sigIdx, int ctx, unsigned int flags, sm_ncclComm_t comm,                 \
     sm_cudaStream_t stream))                                                               \
  X(ncclWaitSignal, sm_ncclResult_t,                                                        \
    (int nDesc, sm_ncclWaitSignalDesc_t *signalDescs, sm_ncclComm_t comm,                   \
     sm_cudaStream_t stream))                                                               \
  X(ncclPutSignal, sm_ncclResult_t,                                                         \
    (const void *localbuff, size_t count, int datatype, int peer, sm_ncclWindow_t peerWin,  \
     size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, sm_ncclComm_t comm,     \
     sm_cudaStream_t stream))                                                               \
  X(ncclTeamLsa, sm_ncclTeam_t, (sm_ncclComm_t comm))                                       \
  X(ncclSend, sm_ncclResult_t,                                                              \
    (const void *sendbuff, size_t count, int datatype, int peer, sm_ncclComm_t comm,        \
     sm_cudaStream_t stream))                                                               \
  X(ncclRecv, sm_ncclResult_t,                                                              \
    (void *recvbuff, size_t count, int datatype, int peer, sm_ncclComm_t comm,              \
     sm_cudaStream_t stream))                                                               \
  X(ncclGroupStart, sm_ncclResult_t, (void))                                                \
  X(ncclGroupEnd, sm_ncclResult_t, (void))

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
/* Whether the one-sided API is there: ncclSignal, ncclWaitSignal and
 * ncclPutSignal (NCCL >= 2.29). */
int smnc_has_one_sided(void);
/* Whether the host's LSA team query ncclTeamLsa is there. */
int smnc_has_team_lsa(void);

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
                    unsigned long long recv, size_t sendcount, int datatype);
int smnc_all_reduce(uintptr_t ctx, uintptr_t comm, uintptr_t stream, unsigned long long send,
                    unsigned long long recv, size_t count, int datatype, int op);
int smnc_reduce_scatter(uintptr_t ctx, uintptr_t comm, uintptr_t stream, unsigned long long send,
                        unsigned long long recv, size_t recvcount, int datatype, int op);
/* ncclCommSplit with a NULL config; *newcomm is 0 for NCCL_SPLIT_NOCOLOR. */
int smnc_comm_split(uintptr_t ctx, uintptr_t comm, int color, int key, uintptr_t *newcomm);
int smnc_comm_destroy(uintptr_t ctx, uintptr_t comm);
/* The one-sided calls use context 0 and flags 0. */
int smnc_signal(uintptr_t ctx, uintptr_t comm, uintptr_t stream, int peer, int sig);
int smnc_wait_signal(uintptr_t ctx, uintptr_t comm, uintptr_t stream, int peer, int sig, int count);
int smnc_put_signal(uintptr_t ctx, uintptr_t comm, uintptr_t stream, unsigned long long send, size_t count,
                    int datatype, int peer, uintptr_t win, size_t offset, int sig);
/* One group of point-to-point transfers: ncclGroupStart, for op k
 * ncclRecv (recv[k] != 0) or ncclSend of bytes[k] bytes (ncclUint8) at
 * addrs[k] with peers[k], ncclGroupEnd. A failing op ends the list (the
 * group is still ended); *failed is its index, n for ncclGroupEnd, -1 on
 * success. */
int smnc_send_recv(uintptr_t ctx, uintptr_t comm, uintptr_t stream, int n, const int *peers,
                   const unsigned long long *addrs, const size_t *bytes, const int *recv, int *failed);
/* ncclTeamLsa(comm) into *nranks, *rank, *stride; returns 0. */
int smnc_team_lsa(uintptr_t ctx, uintptr_t comm, int *nranks, int *rank, int *stride);
int smnc_window_register(uintptr_t ctx, uintptr_t comm, unsigned long long addr, size_t size, uintptr_t *win);
int smnc_window_deregister(uintptr_t ctx, uintptr_t comm, uintptr_t win);
int smnc_peer_pointer(uintptr_t ctx, uintptr_t win, size_t offset, int peer, unsigned long long *ptr);

#endif /* SYMMEM_CUDA_NCCL_H */
