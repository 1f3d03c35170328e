/*
 * shim.h - the C side of the cuda backend: the driver loader and the small
 * trampolines that Go calls through cgo.
 *
 * Rules the trampolines follow (see doc.go, Note [contexts]):
 *   - handles cross the cgo boundary as integers (uintptr_t for contexts and
 *     streams, unsigned long long for addresses and allocation handles), so Go
 *     never holds a C pointer and C never keeps a Go pointer;
 *   - a trampoline that needs a context takes it as its first argument and
 *     makes it current, calls the driver, and restores the thread's previous
 *     context, all within the one cgo call (goroutines migrate between OS
 *     threads between cgo calls, the current context is per OS thread);
 *   - every trampoline returns an smcu_status naming the driver function that
 *     failed, so the Go side can say exactly what went wrong.
 */
#ifndef SYMMEM_CUDA_SHIM_H
#define SYMMEM_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "driver.h"

/* The result of one trampoline: res is a CUresult (0 on success) and call
 * the static name of the driver function that returned it. */
typedef struct smcu_status {
  int res;
  const char *call;
} smcu_status;

/* The driver's function table, filled once by smcu_load. */
typedef struct smcu_table {
#define SMCU_FIELD(api, symbol, params) sm_CUresult(*symbol) params;
  SM_CU_FUNCTIONS(SMCU_FIELD, SM_CU_PREFIXED)
#undef SMCU_FIELD
} smcu_table;

/* smcu_load results. */
enum {
  SMCU_LOAD_OK = 0,
  SMCU_LOAD_DLOPEN = 1,  /* dlopen failed; err holds dlerror() */
  SMCU_LOAD_SYMBOL = 2,  /* a function is missing; err holds its name */
  SMCU_LOAD_OTHER = 3    /* a different driver library is already loaded */
};

/* Loads the driver at path (dlopen RTLD_NOW|RTLD_LOCAL) and resolves every
 * function of SM_CU_FUNCTIONS. Not thread-safe: the Go side holds a lock.
 * Loading again with a path that names the library already loaded is a no-op;
 * the table is published only when every symbol resolved. */
int smcu_load(const char *path, char *err, size_t errlen);

/* cuGetErrorName / cuGetErrorString, or NULL when unknown or not loaded. */
const char *smcu_error_name(int res);
const char *smcu_error_string(int res);

/* Calls that need no context. */
smcu_status smcu_init(void);
smcu_status smcu_driver_version(int *version);
smcu_status smcu_device_count(int *count);
smcu_status smcu_device_get(int ordinal, int *dev);
smcu_status smcu_device_attribute(int dev, int attr, int *value);
smcu_status smcu_device_name(int dev, char *buf, int len);
smcu_status smcu_device_uuid(int dev, unsigned char *out16);
smcu_status smcu_can_access_peer(int dev, int peer, int *can);
smcu_status smcu_primary_retain(int dev, uintptr_t *ctx);
smcu_status smcu_primary_release(int dev);
smcu_status smcu_current_context(uintptr_t *ctx);
smcu_status smcu_set_current_context(uintptr_t ctx); /* for tests */

/* Calls made in context ctx (made current for the call, then restored). */
smcu_status smcu_granularity(uintptr_t ctx, int dev, int handle_types, size_t *gran);
smcu_status smcu_mem_info(uintptr_t ctx, size_t *free_bytes, size_t *total_bytes);
smcu_status smcu_mem_create(uintptr_t ctx, int dev, int handle_types, size_t size,
                            unsigned long long *handle);
smcu_status smcu_mem_release(uintptr_t ctx, unsigned long long handle);
smcu_status smcu_reserve(uintptr_t ctx, size_t size, size_t alignment, unsigned long long *addr);
smcu_status smcu_unreserve(uintptr_t ctx, unsigned long long addr, size_t size);
/* The most devices one mapping grants access to (the mapping device first,
 * then the peers that can reach it). */
#define SMCU_MAX_ACCESS 64
smcu_status smcu_map(uintptr_t ctx, const int *devs, int ndevs, unsigned long long addr,
                     size_t size, unsigned long long handle);
smcu_status smcu_unmap(uintptr_t ctx, unsigned long long addr, size_t size);
smcu_status smcu_export_fd(uintptr_t ctx, unsigned long long handle, int *fd);
smcu_status smcu_import_fd(uintptr_t ctx, int fd, unsigned long long *handle);
smcu_status smcu_ctx_synchronize(uintptr_t ctx);
smcu_status smcu_stream_create(uintptr_t ctx, uintptr_t *stream);
smcu_status smcu_stream_destroy(uintptr_t ctx, uintptr_t stream);
smcu_status smcu_stream_synchronize(uintptr_t ctx, uintptr_t stream);
smcu_status smcu_stream_wait(uintptr_t ctx, uintptr_t waiter, uintptr_t other);
smcu_status smcu_memset(uintptr_t ctx, uintptr_t stream, unsigned long long addr,
                        unsigned char value, size_t size);
smcu_status smcu_copy(uintptr_t ctx, uintptr_t stream, unsigned long long dst,
                      unsigned long long src, size_t size);
/* Pinned, portable host memory (cuMemHostAlloc / cuMemFreeHost). */
smcu_status smcu_host_alloc(uintptr_t ctx, size_t size, void **p);
smcu_status smcu_host_free(uintptr_t ctx, void *p);
smcu_status smcu_write_value32(uintptr_t ctx, uintptr_t stream, unsigned long long addr,
                               uint32_t value);
/* One 32-bit stream memory operation for smcu_batch_memops. */
typedef struct smcu_memop {
  unsigned long long addr;
  uint32_t value;
  int wait; /* 0: store value; 1: wait until *addr == value; 2: wait until
               (int32_t)(*addr - value) >= 0 (CU_STREAM_WAIT_VALUE_GEQ) */
} smcu_memop;
/* The most operations one cuStreamBatchMemOp call takes (the driver's limit
 * is "less than 256"). */
#define SMCU_MAX_BATCH 255
smcu_status smcu_batch_memops(uintptr_t ctx, uintptr_t stream, const smcu_memop *ops, int n);
smcu_status smcu_wait_value32(uintptr_t ctx, uintptr_t stream, unsigned long long addr,
                              uint32_t value);

#endif /* SYMMEM_CUDA_SHIM_H */
