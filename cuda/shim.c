/*
 * shim.c - loads libcuda with dlopen and calls it through a table of function
 * pointers. See shim.h for the rules every trampoline follows.
 */
#include "shim.h"

#include <stdio.h>
#include <string.h>

/* The published table and the library it came from. Written only by
 * smcu_load under the Go side's lock, before any trampoline can run. */
static smcu_table smcu;

#define SMCU_STATUS(r, name) ((smcu_status){(int)(r), (name)})
#define SMCU_OK SMCU_STATUS(SM_CUDA_SUCCESS, NULL)

/* ---- loading -------------------------------------------------------------
 * The library is found and opened by dynlib.go (OpenLibrary) and its
 * symbols resolved in the order of smcu_symbol_names (Library.Resolve). */

const char *const smcu_symbol_names[] = {
#define SMCU_NAME(api, symbol, params) #symbol,
    SM_CU_FUNCTIONS(SMCU_NAME, SM_CU_PREFIXED)
    SM_CU_OPTIONAL_FUNCTIONS(SMCU_NAME, SM_CU_PREFIXED)
#undef SMCU_NAME
};
const int smcu_symbol_count = (int)(sizeof smcu_symbol_names / sizeof smcu_symbol_names[0]);
static const char *const smcu_optional_names[] = {
#define SMCU_NAME(api, symbol, params) #symbol,
    SM_CU_OPTIONAL_FUNCTIONS(SMCU_NAME, SM_CU_PREFIXED)
#undef SMCU_NAME
};
const int smcu_optional_count = (int)(sizeof smcu_optional_names / sizeof smcu_optional_names[0]);

/* The table is a struct of function pointers, filled as an array. */
_Static_assert(sizeof(smcu_table) == sizeof smcu_symbol_names / sizeof smcu_symbol_names[0] * sizeof(void *),
               "smcu_table must hold exactly one pointer per symbol");

void smcu_install(const void *ptrs) { memcpy(&smcu, ptrs, sizeof smcu); }

const char *smcu_error_name(int res) {
  const char *s = NULL;
  if (smcu.cuGetErrorName == NULL || smcu.cuGetErrorName((sm_CUresult)res, &s) != SM_CUDA_SUCCESS)
    return NULL;
  return s;
}

const char *smcu_error_string(int res) {
  const char *s = NULL;
  if (smcu.cuGetErrorString == NULL ||
      smcu.cuGetErrorString((sm_CUresult)res, &s) != SM_CUDA_SUCCESS)
    return NULL;
  return s;
}

/* ---- context scope --------------------------------------------------------
 * Makes ctx current on the calling OS thread unless cuCtxGetCurrent says it
 * already is, and remembers what to put back. Restoring matters: the CUDA
 * runtime takes the thread's current context as its current device, so
 * leaving device 1's context current on a PyTorch thread that is working on
 * device 0 would send PyTorch's next kernels to the wrong GPU. When the
 * context already matches (the common case for PyTorch, which makes the
 * device's primary context current itself) the cost is one cuCtxGetCurrent.
 * A failure to restore is ignored: it can only mean that the previous context
 * was destroyed meanwhile. */
typedef struct smcu_scope {
  sm_CUcontext prev;
  int switched;
} smcu_scope;

static smcu_status smcu_enter(uintptr_t ctx, smcu_scope *sc) {
  sm_CUcontext cur = NULL;
  sc->switched = 0;
  sm_CUresult r = smcu.cuCtxGetCurrent(&cur);
  if (r != SM_CUDA_SUCCESS)
    return SMCU_STATUS(r, "cuCtxGetCurrent");
  if (cur == (sm_CUcontext)ctx)
    return SMCU_OK;
  r = smcu.cuCtxSetCurrent((sm_CUcontext)ctx);
  if (r != SM_CUDA_SUCCESS)
    return SMCU_STATUS(r, "cuCtxSetCurrent");
  sc->prev = cur;
  sc->switched = 1;
  return SMCU_OK;
}

static void smcu_leave(const smcu_scope *sc) {
  if (sc->switched)
    (void)smcu.cuCtxSetCurrent(sc->prev);
}

int smcu_scope_enter(uintptr_t ctx, uintptr_t *prev) {
  smcu_scope sc;
  if (smcu.cuCtxGetCurrent == NULL || smcu_enter(ctx, &sc).res != SM_CUDA_SUCCESS || !sc.switched)
    return 0;
  *prev = (uintptr_t)sc.prev;
  return 1;
}

void smcu_scope_leave(uintptr_t prev) { (void)smcu.cuCtxSetCurrent((sm_CUcontext)prev); }

/* Runs one driver call, expr, in ctx and returns its status named name. */
#define SMCU_IN_CTX(ctx, name, expr)                                                        \
  do {                                                                                     \
    smcu_scope sc_;                                                                        \
    smcu_status st_ = smcu_enter((ctx), &sc_);                                             \
    if (st_.res != SM_CUDA_SUCCESS)                                                        \
      return st_;                                                                          \
    sm_CUresult r_ = (expr);                                                               \
    smcu_leave(&sc_);                                                                      \
    return SMCU_STATUS(r_, (name));                                                        \
  } while (0)

static void smcu_prop(sm_CUmemAllocationProp *p, int dev, int handle_types) {
  memset(p, 0, sizeof *p);
  p->type = SM_CU_MEM_ALLOCATION_TYPE_PINNED;
  p->requestedHandleTypes = (sm_CUmemAllocationHandleType)handle_types;
  p->location.type = SM_CU_MEM_LOCATION_TYPE_DEVICE;
  p->location.id = dev;
}

/* ---- calls without a context -------------------------------------------- */

smcu_status smcu_init(void) { return SMCU_STATUS(smcu.cuInit(0), "cuInit"); }

smcu_status smcu_driver_version(int *version) {
  return SMCU_STATUS(smcu.cuDriverGetVersion(version), "cuDriverGetVersion");
}

smcu_status smcu_device_count(int *count) {
  return SMCU_STATUS(smcu.cuDeviceGetCount(count), "cuDeviceGetCount");
}

smcu_status smcu_device_get(int ordinal, int *dev) {
  return SMCU_STATUS(smcu.cuDeviceGet(dev, ordinal), "cuDeviceGet");
}

smcu_status smcu_device_attribute(int dev, int attr, int *value) {
  return SMCU_STATUS(smcu.cuDeviceGetAttribute(value, (sm_CUdevice_attribute)attr, dev),
                     "cuDeviceGetAttribute");
}

smcu_status smcu_device_name(int dev, char *buf, int len) {
  return SMCU_STATUS(smcu.cuDeviceGetName(buf, len, dev), "cuDeviceGetName");
}

smcu_status smcu_device_uuid(int dev, unsigned char *out16) {
  sm_CUuuid u;
  memset(&u, 0, sizeof u);
  sm_CUresult r = smcu.cuDeviceGetUuid_v2(&u, dev);
  memcpy(out16, u.bytes, sizeof u.bytes);
  return SMCU_STATUS(r, "cuDeviceGetUuid_v2");
}

smcu_status smcu_can_access_peer(int dev, int peer, int *can) {
  return SMCU_STATUS(smcu.cuDeviceCanAccessPeer(can, dev, peer), "cuDeviceCanAccessPeer");
}

smcu_status smcu_p2p_attribute(int dev, int peer, int attr, int *value) {
  return SMCU_STATUS(
      smcu.cuDeviceGetP2PAttribute(value, (sm_CUdevice_P2PAttribute)attr, dev, peer),
      "cuDeviceGetP2PAttribute");
}

smcu_status smcu_device_total_mem(int dev, size_t *bytes) {
  return SMCU_STATUS(smcu.cuDeviceTotalMem_v2(bytes, dev), "cuDeviceTotalMem_v2");
}

smcu_status smcu_primary_retain(int dev, uintptr_t *ctx) {
  sm_CUcontext c = NULL;
  sm_CUresult r = smcu.cuDevicePrimaryCtxRetain(&c, dev);
  *ctx = (uintptr_t)c;
  return SMCU_STATUS(r, "cuDevicePrimaryCtxRetain");
}

smcu_status smcu_primary_release(int dev) {
  return SMCU_STATUS(smcu.cuDevicePrimaryCtxRelease_v2(dev), "cuDevicePrimaryCtxRelease_v2");
}

smcu_status smcu_current_context(uintptr_t *ctx) {
  sm_CUcontext c = NULL;
  sm_CUresult r = smcu.cuCtxGetCurrent(&c);
  *ctx = (uintptr_t)c;
  return SMCU_STATUS(r, "cuCtxGetCurrent");
}

smcu_status smcu_set_current_context(uintptr_t ctx) {
  return SMCU_STATUS(smcu.cuCtxSetCurrent((sm_CUcontext)ctx), "cuCtxSetCurrent");
}

/* ---- calls in a context ------------------------------------------------- */

smcu_status smcu_granularity(uintptr_t ctx, int dev, int handle_types, size_t *gran) {
  sm_CUmemAllocationProp prop;
  smcu_prop(&prop, dev, handle_types);
  SMCU_IN_CTX(ctx, "cuMemGetAllocationGranularity",
              smcu.cuMemGetAllocationGranularity(gran, &prop,
                                                 SM_CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}

smcu_status smcu_mem_info(uintptr_t ctx, size_t *free_bytes, size_t *total_bytes) {
  SMCU_IN_CTX(ctx, "cuMemGetInfo_v2", smcu.cuMemGetInfo_v2(free_bytes, total_bytes));
}

smcu_status smcu_mem_create(uintptr_t ctx, int dev, int handle_types, size_t size,
                            unsigned long long *handle) {
  sm_CUmemAllocationProp prop;
  smcu_prop(&prop, dev, handle_types);
  SMCU_IN_CTX(ctx, "cuMemCreate", smcu.cuMemCreate(handle, size, &prop, 0));
}

smcu_status smcu_mem_access(uintptr_t ctx, int dev, unsigned long long addr,
                            unsigned long long *flags) {
  sm_CUmemLocation loc;
  memset(&loc, 0, sizeof loc);
  loc.type = SM_CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;
  SMCU_IN_CTX(ctx, "cuMemGetAccess", smcu.cuMemGetAccess(flags, &loc, addr));
}

smcu_status smcu_mem_release(uintptr_t ctx, unsigned long long handle) {
  SMCU_IN_CTX(ctx, "cuMemRelease", smcu.cuMemRelease(handle));
}

smcu_status smcu_reserve(uintptr_t ctx, size_t size, size_t alignment, unsigned long long *addr) {
  SMCU_IN_CTX(ctx, "cuMemAddressReserve", smcu.cuMemAddressReserve(addr, size, alignment, 0, 0));
}

smcu_status smcu_unreserve(uintptr_t ctx, unsigned long long addr, size_t size) {
  SMCU_IN_CTX(ctx, "cuMemAddressFree", smcu.cuMemAddressFree(addr, size));
}

smcu_status smcu_map(uintptr_t ctx, const int *devs, int ndevs, unsigned long long addr,
                     size_t size, unsigned long long handle) {
  smcu_scope sc;
  smcu_status st = smcu_enter(ctx, &sc);
  if (st.res != SM_CUDA_SUCCESS)
    return st;
  sm_CUresult r = smcu.cuMemMap(addr, size, 0, handle, 0);
  if (r != SM_CUDA_SUCCESS) {
    smcu_leave(&sc);
    return SMCU_STATUS(r, "cuMemMap");
  }
  sm_CUmemAccessDesc desc[SMCU_MAX_ACCESS];
  if (ndevs > SMCU_MAX_ACCESS)
    ndevs = SMCU_MAX_ACCESS;
  memset(desc, 0, sizeof desc);
  for (int i = 0; i < ndevs; i++) {
    desc[i].location.type = SM_CU_MEM_LOCATION_TYPE_DEVICE;
    desc[i].location.id = devs[i];
    desc[i].flags = SM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  r = smcu.cuMemSetAccess(addr, size, desc, (size_t)ndevs);
  if (r != SM_CUDA_SUCCESS) {
    (void)smcu.cuMemUnmap(addr, size); /* leave nothing half-mapped */
    smcu_leave(&sc);
    return SMCU_STATUS(r, "cuMemSetAccess");
  }
  smcu_leave(&sc);
  return SMCU_OK;
}

smcu_status smcu_unmap(uintptr_t ctx, unsigned long long addr, size_t size) {
  SMCU_IN_CTX(ctx, "cuMemUnmap", smcu.cuMemUnmap(addr, size));
}

smcu_status smcu_export_fd(uintptr_t ctx, unsigned long long handle, int *fd) {
  *fd = -1;
  SMCU_IN_CTX(ctx, "cuMemExportToShareableHandle",
              smcu.cuMemExportToShareableHandle(fd, handle,
                                                SM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
}

smcu_status smcu_fabric_domain(int dev, unsigned char *uuid16, unsigned int *clique) {
  if (smcu.cuDeviceGetFabricClusterUuid == NULL || smcu.cuDeviceGetCliqueInfo == NULL)
    return SMCU_STATUS(SM_CUDA_ERROR_NOT_SUPPORTED, "cuDeviceGetFabricClusterUuid (CUDA 13 drivers)");
  sm_CUuuid u;
  sm_CUresult r = smcu.cuDeviceGetFabricClusterUuid(&u, dev);
  if (r != SM_CUDA_SUCCESS)
    return SMCU_STATUS(r, "cuDeviceGetFabricClusterUuid");
  memcpy(uuid16, u.bytes, 16);
  sm_CUcliqueInfo info[16];
  size_t n = sizeof info / sizeof info[0];
  r = smcu.cuDeviceGetCliqueInfo(info, &n, dev);
  if (r != SM_CUDA_SUCCESS)
    return SMCU_STATUS(r, "cuDeviceGetCliqueInfo");
  for (size_t i = 0; i < n && i < sizeof info / sizeof info[0]; i++) {
    if (info[i].type == 0) { /* CU_CLIQUE_TYPE_UNICAST_POINTER */
      *clique = info[i].id;
      return SMCU_OK;
    }
  }
  return SMCU_STATUS(SM_CUDA_ERROR_NOT_SUPPORTED, "cuDeviceGetCliqueInfo (no unicast clique)");
}

smcu_status smcu_export_fabric(uintptr_t ctx, unsigned long long handle, unsigned char *out64) {
  SMCU_IN_CTX(ctx, "cuMemExportToShareableHandle(FABRIC)",
              smcu.cuMemExportToShareableHandle(out64, handle, SM_CU_MEM_HANDLE_TYPE_FABRIC, 0));
}

smcu_status smcu_import_fabric(uintptr_t ctx, const unsigned char *in64, unsigned long long *handle) {
  SMCU_IN_CTX(ctx, "cuMemImportFromShareableHandle(FABRIC)",
              smcu.cuMemImportFromShareableHandle(handle, (void *)in64, SM_CU_MEM_HANDLE_TYPE_FABRIC));
}

smcu_status smcu_import_fd(uintptr_t ctx, int fd, unsigned long long *handle) {
  SMCU_IN_CTX(ctx, "cuMemImportFromShareableHandle",
              smcu.cuMemImportFromShareableHandle(handle, (void *)(intptr_t)fd,
                                                  SM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
}

smcu_status smcu_ctx_synchronize(uintptr_t ctx) {
  SMCU_IN_CTX(ctx, "cuCtxSynchronize", smcu.cuCtxSynchronize());
}

/* Stream and event creation queue no work; they may run while this thread
 * captures a CUDA graph (the copies beside a captured collective make their
 * streams at its first call), so they run in the relaxed capture mode, the
 * thread's own mode restored after. */
smcu_status smcu_stream_create(uintptr_t ctx, uintptr_t *stream) {
  sm_CUstream s = NULL;
  smcu_scope sc;
  smcu_status st = smcu_enter(ctx, &sc);
  if (st.res != SM_CUDA_SUCCESS)
    return st;
  sm_CUstreamCaptureMode mode = SM_CU_STREAM_CAPTURE_MODE_RELAXED;
  sm_CUresult r = smcu.cuThreadExchangeStreamCaptureMode(&mode);
  if (r != SM_CUDA_SUCCESS) {
    smcu_leave(&sc);
    return SMCU_STATUS(r, "cuThreadExchangeStreamCaptureMode");
  }
  r = smcu.cuStreamCreate(&s, SM_CU_STREAM_NON_BLOCKING);
  (void)smcu.cuThreadExchangeStreamCaptureMode(&mode);
  smcu_leave(&sc);
  *stream = (uintptr_t)s;
  return SMCU_STATUS(r, "cuStreamCreate");
}

smcu_status smcu_stream_destroy(uintptr_t ctx, uintptr_t stream) {
  SMCU_IN_CTX(ctx, "cuStreamDestroy_v2", smcu.cuStreamDestroy_v2((sm_CUstream)stream));
}

smcu_status smcu_stream_synchronize(uintptr_t ctx, uintptr_t stream) {
  SMCU_IN_CTX(ctx, "cuStreamSynchronize", smcu.cuStreamSynchronize((sm_CUstream)stream));
}

/* Later work on waiter waits for the work queued on other so far. The event
 * may be destroyed right after the wait is enqueued: the driver releases it
 * once the recorded work completes. In the relaxed capture mode (above):
 * inside a capture the record and the wait fork or join a stream. */
smcu_status smcu_stream_wait(uintptr_t ctx, uintptr_t waiter, uintptr_t other) {
  if (waiter == other)
    return SMCU_OK; /* stream order already guarantees it */
  smcu_scope sc;
  smcu_status st = smcu_enter(ctx, &sc);
  if (st.res != SM_CUDA_SUCCESS)
    return st;
  sm_CUstreamCaptureMode mode = SM_CU_STREAM_CAPTURE_MODE_RELAXED;
  sm_CUresult r = smcu.cuThreadExchangeStreamCaptureMode(&mode);
  if (r != SM_CUDA_SUCCESS) {
    smcu_leave(&sc);
    return SMCU_STATUS(r, "cuThreadExchangeStreamCaptureMode");
  }
  sm_CUevent ev = NULL;
  r = smcu.cuEventCreate(&ev, SM_CU_EVENT_DISABLE_TIMING);
  if (r != SM_CUDA_SUCCESS) {
    st = SMCU_STATUS(r, "cuEventCreate");
    goto out;
  }
  r = smcu.cuEventRecord(ev, (sm_CUstream)other);
  if (r != SM_CUDA_SUCCESS) {
    st = SMCU_STATUS(r, "cuEventRecord");
    (void)smcu.cuEventDestroy_v2(ev);
    goto out;
  }
  r = smcu.cuStreamWaitEvent((sm_CUstream)waiter, ev, 0);
  if (r != SM_CUDA_SUCCESS) {
    st = SMCU_STATUS(r, "cuStreamWaitEvent");
    (void)smcu.cuEventDestroy_v2(ev);
    goto out;
  }
  r = smcu.cuEventDestroy_v2(ev);
  if (r != SM_CUDA_SUCCESS)
    st = SMCU_STATUS(r, "cuEventDestroy_v2");
out:
  (void)smcu.cuThreadExchangeStreamCaptureMode(&mode);
  smcu_leave(&sc);
  return st;
}

/* Enqueues expr on stream, then waits for the stream. */
static smcu_status smcu_sync_after(uintptr_t stream, sm_CUresult r, const char *name) {
  if (r != SM_CUDA_SUCCESS)
    return SMCU_STATUS(r, name);
  return SMCU_STATUS(smcu.cuStreamSynchronize((sm_CUstream)stream), "cuStreamSynchronize");
}

smcu_status smcu_memset(uintptr_t ctx, uintptr_t stream, unsigned long long addr,
                        unsigned char value, size_t size) {
  smcu_scope sc;
  smcu_status st = smcu_enter(ctx, &sc);
  if (st.res != SM_CUDA_SUCCESS)
    return st;
  st = smcu_sync_after(stream, smcu.cuMemsetD8Async(addr, value, size, (sm_CUstream)stream),
                       "cuMemsetD8Async");
  smcu_leave(&sc);
  return st;
}

smcu_status smcu_copy(uintptr_t ctx, uintptr_t stream, unsigned long long dst,
                      unsigned long long src, size_t size) {
  smcu_scope sc;
  smcu_status st = smcu_enter(ctx, &sc);
  if (st.res != SM_CUDA_SUCCESS)
    return st;
  st = smcu_sync_after(stream, smcu.cuMemcpyAsync(dst, src, size, (sm_CUstream)stream),
                       "cuMemcpyAsync");
  smcu_leave(&sc);
  return st;
}

/* Pinning runs on threads of the library's own (a pause, or pinning ahead in
 * the background) while another thread may be capturing a CUDA graph in
 * global mode, which would prohibit this thread's cuMemHostAlloc and spoil
 * the capture. cuMemHostAlloc queues no work on any stream, so this thread
 * asks for the relaxed mode around the call and restores its own after. */
smcu_status smcu_host_alloc(uintptr_t ctx, size_t size, void **p) {
  smcu_scope sc;
  smcu_status st = smcu_enter(ctx, &sc);
  if (st.res != SM_CUDA_SUCCESS)
    return st;
  sm_CUstreamCaptureMode mode = SM_CU_STREAM_CAPTURE_MODE_RELAXED;
  sm_CUresult r = smcu.cuThreadExchangeStreamCaptureMode(&mode);
  if (r != SM_CUDA_SUCCESS) {
    smcu_leave(&sc);
    return SMCU_STATUS(r, "cuThreadExchangeStreamCaptureMode");
  }
  r = smcu.cuMemHostAlloc(p, size, SM_CU_MEMHOSTALLOC_PORTABLE);
  (void)smcu.cuThreadExchangeStreamCaptureMode(&mode);
  smcu_leave(&sc);
  return r == SM_CUDA_SUCCESS ? SMCU_OK : SMCU_STATUS(r, "cuMemHostAlloc");
}

smcu_status smcu_host_free(uintptr_t ctx, void *p) {
  SMCU_IN_CTX(ctx, "cuMemFreeHost", smcu.cuMemFreeHost(p));
}

smcu_status smcu_memset_async(uintptr_t ctx, uintptr_t stream, unsigned long long addr,
                              unsigned char value, size_t size) {
  SMCU_IN_CTX(ctx, "cuMemsetD8Async", smcu.cuMemsetD8Async(addr, value, size, (sm_CUstream)stream));
}

smcu_status smcu_copy_async(uintptr_t ctx, uintptr_t stream, unsigned long long dst,
                            unsigned long long src, size_t size) {
  SMCU_IN_CTX(ctx, "cuMemcpyAsync", smcu.cuMemcpyAsync(dst, src, size, (sm_CUstream)stream));
}

smcu_status smcu_stream_is_capturing(uintptr_t ctx, uintptr_t stream, int *status) {
  *status = 0;
  if (smcu.cuStreamIsCapturing == NULL)
    return SMCU_OK;
  SMCU_IN_CTX(ctx, "cuStreamIsCapturing", smcu.cuStreamIsCapturing((sm_CUstream)stream, status));
}

smcu_status smcu_write_value32(uintptr_t ctx, uintptr_t stream, unsigned long long addr,
                               uint32_t value) {
  SMCU_IN_CTX(ctx, "cuStreamWriteValue32_v2",
              smcu.cuStreamWriteValue32_v2((sm_CUstream)stream, addr, value,
                                           SM_CU_STREAM_WRITE_VALUE_DEFAULT));
}

smcu_status smcu_batch_memops(uintptr_t ctx, uintptr_t stream, const smcu_memop *ops, int n) {
  sm_CUstreamBatchMemOpParams params[SMCU_MAX_BATCH];
  if (n <= 0 || n > SMCU_MAX_BATCH)
    return SMCU_STATUS(SM_CUDA_ERROR_INVALID_VALUE, "cuStreamBatchMemOp_v2");
  memset(params, 0, sizeof params);
  for (int i = 0; i < n; i++) {
    if (ops[i].wait) {
      params[i].waitValue.operation = SM_CU_STREAM_MEM_OP_WAIT_VALUE_32;
      params[i].waitValue.address = ops[i].addr;
      params[i].waitValue.value = ops[i].value;
      params[i].waitValue.flags = ops[i].wait == 2 ? SM_CU_STREAM_WAIT_VALUE_GEQ : SM_CU_STREAM_WAIT_VALUE_EQ;
    } else {
      params[i].writeValue.operation = SM_CU_STREAM_MEM_OP_WRITE_VALUE_32;
      params[i].writeValue.address = ops[i].addr;
      params[i].writeValue.value = ops[i].value;
      params[i].writeValue.flags = SM_CU_STREAM_WRITE_VALUE_DEFAULT;
    }
  }
  SMCU_IN_CTX(ctx, "cuStreamBatchMemOp_v2",
              smcu.cuStreamBatchMemOp_v2((sm_CUstream)stream, (unsigned int)n, params, 0));
}

smcu_status smcu_wait_value32(uintptr_t ctx, uintptr_t stream, unsigned long long addr,
                              uint32_t value) {
  SMCU_IN_CTX(ctx, "cuStreamWaitValue32_v2",
              smcu.cuStreamWaitValue32_v2((sm_CUstream)stream, addr, value,
                                          SM_CU_STREAM_WAIT_VALUE_EQ));
}

/* ---- kernels -------------------------------------------------------------- */

smcu_status smcu_module_load(uintptr_t ctx, const void *image, uintptr_t *module) {
  sm_CUmodule m = NULL;
  smcu_scope sc;
  smcu_status st = smcu_enter(ctx, &sc);
  if (st.res != SM_CUDA_SUCCESS)
    return st;
  sm_CUresult r = smcu.cuModuleLoadData(&m, image);
  smcu_leave(&sc);
  *module = (uintptr_t)m;
  return SMCU_STATUS(r, "cuModuleLoadData");
}

smcu_status smcu_module_unload(uintptr_t ctx, uintptr_t module) {
  SMCU_IN_CTX(ctx, "cuModuleUnload", smcu.cuModuleUnload((sm_CUmodule)module));
}

smcu_status smcu_module_function(uintptr_t ctx, uintptr_t module, const char *name, uintptr_t *fn) {
  sm_CUfunction f = NULL;
  smcu_scope sc;
  smcu_status st = smcu_enter(ctx, &sc);
  if (st.res != SM_CUDA_SUCCESS)
    return st;
  sm_CUresult r = smcu.cuModuleGetFunction(&f, (sm_CUmodule)module, name);
  smcu_leave(&sc);
  *fn = (uintptr_t)f;
  return SMCU_STATUS(r, "cuModuleGetFunction");
}

smcu_status smcu_launch(uintptr_t ctx, uintptr_t fn, unsigned grid, unsigned block, uintptr_t stream,
                        void *params, int pdl) {
  void *args[1] = {params};
  if (pdl && smcu.cuLaunchKernelEx != NULL) {
    sm_CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = SM_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    sm_CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = grid;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = block;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = (sm_CUstream)stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    SMCU_IN_CTX(ctx, "cuLaunchKernelEx", smcu.cuLaunchKernelEx(&cfg, (sm_CUfunction)fn, args, NULL));
  }
  SMCU_IN_CTX(ctx, "cuLaunchKernel",
              smcu.cuLaunchKernel((sm_CUfunction)fn, grid, 1, 1, block, 1, 1, 0, (sm_CUstream)stream, args,
                                  NULL));
}
