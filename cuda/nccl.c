/*
 * nccl.c - NCCL's function table and trampolines (see nccl.h).
 */
#include "nccl.h"

#include <string.h>

#include "shim.h"

/* Returns expr, evaluated with ctx current (see nccl.h). */
#define SMNC_IN_CTX(ctx, expr)                                                               \
  do {                                                                                       \
    uintptr_t prev_ = 0;                                                                     \
    int switched_ = (ctx) != 0 && smcu_scope_enter((ctx), &prev_);                           \
    int r_ = (expr);                                                                         \
    if (switched_)                                                                           \
      smcu_scope_leave(prev_);                                                               \
    return r_;                                                                               \
  } while (0)

/* Written once by smnc_install under the Go side's lock, before any
 * trampoline can run. */
static smnc_table smnc;

const char *const smnc_symbol_names[] = {
#define SMNC_NAME(name, ret, params) #name,
    SM_NCCL_FUNCTIONS(SMNC_NAME)
#undef SMNC_NAME
};
const int smnc_symbol_count = (int)(sizeof smnc_symbol_names / sizeof smnc_symbol_names[0]);

_Static_assert(sizeof(sm_ncclWaitSignalDesc_t) == 16, "ncclWaitSignalDesc_t is four ints");
_Static_assert(sizeof(sm_ncclTeam_t) == 12, "ncclTeam_t is three ints");
_Static_assert(sizeof(smnc_table) == sizeof smnc_symbol_names / sizeof smnc_symbol_names[0] * sizeof(void *),
               "smnc_table must hold exactly one pointer per symbol");

void smnc_install(const void *ptrs) { memcpy(&smnc, ptrs, sizeof smnc); }

int smnc_has_peer_pointer(void) { return smnc.ncclGetPeerDevicePointer != NULL; }

int smnc_has_one_sided(void) {
  return smnc.ncclSignal != NULL && smnc.ncclWaitSignal != NULL && smnc.ncclPutSignal != NULL;
}

int smnc_has_team_lsa(void) { return smnc.ncclTeamLsa != NULL; }

int smnc_get_version(int *version) { return smnc.ncclGetVersion(version); }

const char *smnc_error_string(int res) {
  return smnc.ncclGetErrorString != NULL ? smnc.ncclGetErrorString(res) : NULL;
}

const char *smnc_last_error(uintptr_t comm) {
  return smnc.ncclGetLastError != NULL ? smnc.ncclGetLastError((sm_ncclComm_t)comm) : NULL;
}

int smnc_comm_user_rank(uintptr_t comm, int *rank) {
  return smnc.ncclCommUserRank((sm_ncclComm_t)comm, rank);
}

int smnc_comm_count(uintptr_t comm, int *count) {
  return smnc.ncclCommCount((sm_ncclComm_t)comm, count);
}

int smnc_comm_cu_device(uintptr_t comm, int *device) {
  return smnc.ncclCommCuDevice((sm_ncclComm_t)comm, device);
}

int smnc_all_gather(uintptr_t ctx, uintptr_t comm, uintptr_t stream, unsigned long long send,
                    unsigned long long recv, size_t sendcount, int datatype) {
  SMNC_IN_CTX(ctx, smnc.ncclAllGather((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, sendcount,
                                      datatype, (sm_ncclComm_t)comm, (sm_cudaStream_t)stream));
}

int smnc_all_reduce(uintptr_t ctx, uintptr_t comm, uintptr_t stream, unsigned long long send,
                    unsigned long long recv, size_t count, int datatype, int op) {
  SMNC_IN_CTX(ctx, smnc.ncclAllReduce((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, datatype,
                                      op, (sm_ncclComm_t)comm, (sm_cudaStream_t)stream));
}

int smnc_reduce_scatter(uintptr_t ctx, uintptr_t comm, uintptr_t stream, unsigned long long send,
                        unsigned long long recv, size_t recvcount, int datatype, int op) {
  SMNC_IN_CTX(ctx, smnc.ncclReduceScatter((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, recvcount,
                                          datatype, op, (sm_ncclComm_t)comm, (sm_cudaStream_t)stream));
}

static int smnc_split(uintptr_t comm, int color, int key, uintptr_t *newcomm) {
  sm_ncclComm_t n = NULL;
  int r = smnc.ncclCommSplit((sm_ncclComm_t)comm, color, key, &n, NULL);
  *newcomm = (uintptr_t)n;
  return r;
}

int smnc_comm_split(uintptr_t ctx, uintptr_t comm, int color, int key, uintptr_t *newcomm) {
  SMNC_IN_CTX(ctx, smnc_split(comm, color, key, newcomm));
}

int smnc_comm_destroy(uintptr_t ctx, uintptr_t comm) {
  SMNC_IN_CTX(ctx, smnc.ncclCommDestroy((sm_ncclComm_t)comm));
}

int smnc_signal(uintptr_t ctx, uintptr_t comm, uintptr_t stream, int peer, int sig) {
  SMNC_IN_CTX(ctx, smnc.ncclSignal(peer, sig, 0, 0, (sm_ncclComm_t)comm, (sm_cudaStream_t)stream));
}

static int smnc_wait(uintptr_t comm, uintptr_t stream, int peer, int sig, int count) {
  sm_ncclWaitSignalDesc_t d = {.opCnt = count, .peer = peer, .sigIdx = sig, .ctx = 0};
  return smnc.ncclWaitSignal(1, &d, (sm_ncclComm_t)comm, (sm_cudaStream_t)stream);
}

int smnc_wait_signal(uintptr_t ctx, uintptr_t comm, uintptr_t stream, int peer, int sig, int count) {
  SMNC_IN_CTX(ctx, smnc_wait(comm, stream, peer, sig, count));
}

int smnc_put_signal(uintptr_t ctx, uintptr_t comm, uintptr_t stream, unsigned long long send, size_t count,
                    int datatype, int peer, uintptr_t win, size_t offset, int sig) {
  SMNC_IN_CTX(ctx, smnc.ncclPutSignal((const void *)(uintptr_t)send, count, datatype, peer, (sm_ncclWindow_t)win,
                                      offset, sig, 0, 0, (sm_ncclComm_t)comm, (sm_cudaStream_t)stream));
}

static int smnc_team(uintptr_t comm, int *nranks, int *rank, int *stride) {
  sm_ncclTeam_t t = smnc.ncclTeamLsa((sm_ncclComm_t)comm);
  *nranks = t.nRanks;
  *rank = t.rank;
  *stride = t.stride;
  return 0;
}

int smnc_team_lsa(uintptr_t ctx, uintptr_t comm, int *nranks, int *rank, int *stride) {
  SMNC_IN_CTX(ctx, smnc_team(comm, nranks, rank, stride));
}

static int smnc_register(uintptr_t comm, unsigned long long addr, size_t size, uintptr_t *win) {
  sm_ncclWindow_t w = NULL;
  int r = smnc.ncclCommWindowRegister((sm_ncclComm_t)comm, (void *)(uintptr_t)addr, size, &w,
                                      SM_NCCL_WIN_COLL_SYMMETRIC);
  *win = (uintptr_t)w;
  return r;
}

int smnc_window_register(uintptr_t ctx, uintptr_t comm, unsigned long long addr, size_t size, uintptr_t *win) {
  SMNC_IN_CTX(ctx, smnc_register(comm, addr, size, win));
}

int smnc_window_deregister(uintptr_t ctx, uintptr_t comm, uintptr_t win) {
  SMNC_IN_CTX(ctx, smnc.ncclCommWindowDeregister((sm_ncclComm_t)comm, (sm_ncclWindow_t)win));
}

static int smnc_peer(uintptr_t win, size_t offset, int peer, unsigned long long *ptr) {
  void *p = NULL;
  int r = smnc.ncclGetPeerDevicePointer((sm_ncclWindow_t)win, offset, peer, &p);
  *ptr = (unsigned long long)(uintptr_t)p;
  return r;
}

int smnc_peer_pointer(uintptr_t ctx, uintptr_t win, size_t offset, int peer, unsigned long long *ptr) {
  SMNC_IN_CTX(ctx, smnc_peer(win, offset, peer, ptr));
}

static int smnc_p2p(uintptr_t comm, uintptr_t stream, int n, const int *peers, const unsigned long long *addrs,
                    const size_t *bytes, const int *recv, int *failed) {
  *failed = -1;
  int r = smnc.ncclGroupStart();
  if (r != SM_NCCL_SUCCESS) {
    *failed = n;
    return r;
  }
  for (int k = 0; k < n && r == SM_NCCL_SUCCESS; k++) {
    if (recv[k])
      r = smnc.ncclRecv((void *)(uintptr_t)addrs[k], bytes[k], SM_NCCL_UINT8, peers[k], (sm_ncclComm_t)comm,
                        (sm_cudaStream_t)stream);
    else
      r = smnc.ncclSend((const void *)(uintptr_t)addrs[k], bytes[k], SM_NCCL_UINT8, peers[k], (sm_ncclComm_t)comm,
                        (sm_cudaStream_t)stream);
    if (r != SM_NCCL_SUCCESS)
      *failed = k;
  }
  /* The group is ended even after a failed op: NCCL needs every
   * ncclGroupStart matched. */
  int e = smnc.ncclGroupEnd();
  if (r == SM_NCCL_SUCCESS && e != SM_NCCL_SUCCESS) {
    *failed = n;
    r = e;
  }
  return r;
}

int smnc_send_recv(uintptr_t ctx, uintptr_t comm, uintptr_t stream, int n, const int *peers,
                   const unsigned long long *addrs, const size_t *bytes, const int *recv, int *failed) {
  SMNC_IN_CTX(ctx, smnc_p2p(comm, stream, n, peers, addrs, bytes, recv, failed));
}
