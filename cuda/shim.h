/*
 * shim.h - the C side of the cuda backend: the driver's function table and the small
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
  SM_CU_OPTIONAL_FUNCTIONS(SMCU_FIELD, SM_CU_PREFIXED)
#undef SMCU_FIELD
} smcu_table;

/* The symbol names of smcu_table's fields, in order, and their number; the
 * last smcu_optional_count of them are optional (NULL when missing). */
extern const char *const smcu_symbol_names[];
extern const int smcu_symbol_count;
extern const int smcu_optional_count;

/* Publishes a resolved table: ptrs holds smcu_symbol_count function
 * pointers in smcu_symbol_names order (dynlib.go's Library.Resolve fills
 * it). Called once, under the Go side's lock, before any trampoline runs. */
void smcu_install(const void *ptrs);

/* cuGetErrorName / cuGetErrorString, or NULL when unknown or not loaded. */
const char *smcu_error_name(int res);
const char *smcu_error_string(int res);

/* For the package's other C code (nccl.c): makes ctx current on the calling
 * thread unless it already is; returns 1 and the previous context in *prev
 * when it switched (then smcu_scope_leave(prev) puts it back), 0 otherwise
 * (also when no driver is loaded). */
int smcu_scope_enter(uintptr_t ctx, uintptr_t *prev);
void smcu_scope_leave(uintptr_t prev);

/* Calls that need no context. */
smcu_status smcu_init(void);
smcu_status smcu_driver_version(int *version);
smcu_status smcu_device_count(int *count);
smcu_status smcu_device_get(int ordinal, int *dev);
smcu_status smcu_device_attribute(int dev, int attr, int *value);
smcu_status smcu_device_name(int dev, char *buf, int len);
smcu_status smcu_device_uuid(int dev, unsigned char *out16);

/* The device's fabric cluster UUID and unicast clique id. res is
 * SM_CUDA_ERROR_NOT_SUPPORTED (call names the function) when the driver
 * lacks the functions or the device reports no clique. */
smcu_status smcu_fabric_domain(int dev, unsigned char *uuid16, unsigned int *clique);

/* Exports m as a 64-byte fabric handle into out64 / imports one. */
smcu_status smcu_export_fabric(uintptr_t ctx, unsigned long long handle, unsigned char *out64);
smcu_status smcu_import_fabric(uintptr_t ctx, const unsigned char *in64, unsigned long long *handle);
smcu_status smcu_can_access_peer(int dev, int peer, int *can);
smcu_status smcu_p2p_attribute(int dev, int peer, int attr, int *value);
smcu_status smcu_device_total_mem(int dev, size_t *bytes);
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
/* The access flags (0 none, 1 read, 3 read-write) that device dev has to
 * the mapping at addr. */
smcu_status smcu_mem_access(uintptr_t ctx, int dev, unsigned long long addr,
                            unsigned long long *flags);
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
/* The same, enqueued only (the caller waits for the stream, bounded). */
smcu_status smcu_memset_async(uintptr_t ctx, uintptr_t stream, unsigned long long addr,
                              unsigned char value, size_t size);
smcu_status smcu_copy_async(uintptr_t ctx, uintptr_t stream, unsigned long long dst,
                            unsigned long long src, size_t size);
/* *status: the stream's CUstreamCaptureStatus (0 when the driver lacks
 * cuStreamIsCapturing). */
smcu_status smcu_stream_is_capturing(uintptr_t ctx, uintptr_t stream, int *status);
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

/* Kernels (cuda/kernels.go). Modules and functions cross as integers. */
smcu_status smcu_module_load(uintptr_t ctx, const void *image, uintptr_t *module);
smcu_status smcu_module_unload(uintptr_t ctx, uintptr_t module);
smcu_status smcu_module_function(uintptr_t ctx, uintptr_t module, const char *name, uintptr_t *fn);
/* Launches fn (grid x 1 x 1 blocks of block x 1 x 1 threads) on stream with
 * one kernel parameter at params (copied by the driver at launch, so params
 * may be freed when this returns). pdl: with programmatic dependent launch
 * (cuLaunchKernelEx), where the driver has it; the kernel must then wait
 * (griddepcontrol.wait) before touching what earlier kernels wrote. */
smcu_status smcu_launch(uintptr_t ctx, uintptr_t fn, unsigned grid, unsigned block, uintptr_t stream,
                        void *params, int pdl);

#endif /* SYMMEM_CUDA_SHIM_H */
