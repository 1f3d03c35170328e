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

_Static_assert(sizeof(smnc_table) == sizeof smnc_symbol_names / sizeof smnc_symbol_names[0] * sizeof(void *),
               "smnc_table must hold exactly one pointer per symbol");

void smnc_install(const void *ptrs) { memcpy(&smnc, ptrs, sizeof smnc); }

int smnc_has_peer_pointer(void) { return smnc.ncclGetPeerDevicePointer != NULL; }

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
                    unsigned long long recv, size_t bytes) {
  SMNC_IN_CTX(ctx, smnc.ncclAllGather((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, bytes,
                                      SM_NCCL_UINT8, (sm_ncclComm_t)comm, (sm_cudaStream_t)stream));
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
