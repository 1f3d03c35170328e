/*
 * fakecuda.c - a stand-in for libcuda.so.1, for the tests of package cuda on
 * machines without a GPU. It exports exactly the functions of driver.h's
 * SM_CU_FUNCTIONS under the driver's versioned names and implements them on
 * host memory, with the properties the backend relies on:
 *
 *   - physical memory is a memfd (exported/imported as a file descriptor that
 *     works across processes), reserved ranges are PROT_NONE mappings, cuMemMap
 *     maps the memfd there and cuMemSetAccess makes it read/write, so a
 *     missing access grant faults like it would on a GPU;
 *   - every call that needs a context fails with CUDA_ERROR_INVALID_CONTEXT
 *     when the calling thread has none current (contexts are per thread);
 *   - streams are asynchronous: one worker thread each, so stream waits,
 *     events and cross-stream ordering behave as on a GPU;
 *   - a device reports fabric handle support but cuMemCreate refuses
 *     FABRIC handles with CUDA_ERROR_NOT_PERMITTED, as on the H200s without
 *     an IMEX channel (FAKECUDA_FABRIC_OK=1 accepts them). A fabric handle
 *     (64 bytes) names the memory's memfd as /proc/<pid>/fd/<n> of the
 *     exporting process, which an importer of the same user opens: memory
 *     crosses processes, and with SYMMEM_MACHINE_ID imitated machines, the
 *     way a fabric handle crosses machines of one NVLink domain;
 *     FAKECUDA_FABRIC_CLUSTER (any text, made into the 16-byte cluster UUID)
 *     and FAKECUDA_FABRIC_CLIQUE (a number) are what
 *     cuDeviceGetFabricClusterUuid / cuDeviceGetCliqueInfo report (without
 *     the first they return CUDA_ERROR_NOT_SUPPORTED);
 *   - FAKECUDA_DEVICES (default 2) devices of FAKECUDA_MEMORY_MB (default
 *     1024) MiB each; FAKECUDA_INIT_FAIL=1 makes cuInit fail with
 *     CUDA_ERROR_NO_DEVICE; built with -DFAKECUDA_NO_MEMCREATE it lacks
 *     cuMemCreate, like a driver that is too old.
 *
 * Build: gcc -shared -fPIC -I.. -o libcuda_fake.so fakecuda.c -lpthread
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"

/* Our definitions must match the signatures the backend calls through. */
#define FAKE_DECLARE(api, symbol, params) sm_CUresult symbol params;
SM_CU_FUNCTIONS(FAKE_DECLARE, SM_CU_PREFIXED)

#define FAKE_INVALID_CONTEXT ((sm_CUresult)201)
#define FAKE_INVALID_HANDLE ((sm_CUresult)400)
#define FAKE_GRANULARITY ((size_t)2 << 20)
#define FAKE_MAX_DEVICES 16
#define FAKE_MAX_ALLOCS 4096

static pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;
static int fake_ndev;
static size_t fake_capacity;
static size_t fake_used[FAKE_MAX_DEVICES];
static int fake_initialized;

static void fake_config(void) {
  const char *s = getenv("FAKECUDA_DEVICES");
  fake_ndev = s != NULL ? atoi(s) : 2;
  if (fake_ndev < 0 || fake_ndev > FAKE_MAX_DEVICES)
    fake_ndev = 2;
  s = getenv("FAKECUDA_MEMORY_MB");
  fake_capacity = (size_t)(s != NULL ? atol(s) : 1024) << 20;
}

#define NEED_INIT                                                                          \
  if (!fake_initialized)                                                                   \
  return SM_CUDA_ERROR_NOT_INITIALIZED
#define NEED_DEVICE(d)                                                                     \
  if ((d) < 0 || (d) >= fake_ndev)                                                         \
  return SM_CUDA_ERROR_INVALID_DEVICE

/* ---- errors ---------------------------------------------------------------- */

static const struct {
  int res;
  const char *name, *text;
} fake_errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};

static sm_CUresult fake_error(sm_CUresult error, const char **pStr, int name) {
  for (size_t i = 0; i < sizeof fake_errors / sizeof fake_errors[0]; i++) {
    if (fake_errors[i].res == (int)error) {
      *pStr = name ? fake_errors[i].name : fake_errors[i].text;
      return SM_CUDA_SUCCESS;
    }
  }
  *pStr = NULL;
  return SM_CUDA_ERROR_INVALID_VALUE;
}

sm_CUresult cuGetErrorName(sm_CUresult error, const char **pStr) { return fake_error(error, pStr, 1); }
sm_CUresult cuGetErrorString(sm_CUresult error, const char **pStr) { return fake_error(error, pStr, 0); }

/* ---- driver and devices ----------------------------------------------------- */

sm_CUresult cuInit(unsigned int Flags) {
  if (Flags != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_mu);
  fake_config();
  int fail = getenv("FAKECUDA_INIT_FAIL") != NULL;
  if (!fail)
    fake_initialized = 1;
  pthread_mutex_unlock(&fake_mu);
  return fail ? SM_CUDA_ERROR_NO_DEVICE : SM_CUDA_SUCCESS;
}

sm_CUresult cuDriverGetVersion(int *driverVersion) {
  *driverVersion = 12040;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuDeviceGetCount(int *count) {
  NEED_INIT;
  *count = fake_ndev;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuDeviceGet(sm_CUdevice *device, int ordinal) {
  NEED_INIT;
  NEED_DEVICE(ordinal);
  *device = ordinal;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuDeviceGetName(char *name, int len, sm_CUdevice dev) {
  NEED_INIT;
  NEED_DEVICE(dev);
  snprintf(name, (size_t)len, "Fake CUDA Device %d", dev);
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuDeviceGetUuid_v2(sm_CUuuid *uuid, sm_CUdevice dev) {
  NEED_INIT;
  NEED_DEVICE(dev);
  for (int i = 0; i < 16; i++)
    uuid->bytes[i] = (char)(0xfa + i * 16 + dev);
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuDeviceGetAttribute(int *pi, sm_CUdevice_attribute attrib, sm_CUdevice dev) {
  NEED_INIT;
  NEED_DEVICE(dev);
  switch ((int)attrib) {
  case SM_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
  case SM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
  case SM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
  case SM_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    *pi = 1;
    return SM_CUDA_SUCCESS;
  case SM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
    *pi = 9;
    return SM_CUDA_SUCCESS;
  default:
    *pi = 0;
    return SM_CUDA_SUCCESS;
  }
}

sm_CUresult cuDeviceGetP2PAttribute(int *value, sm_CUdevice_P2PAttribute attrib, sm_CUdevice src,
                                    sm_CUdevice dst) {
  NEED_INIT;
  NEED_DEVICE(src);
  NEED_DEVICE(dst);
  /* Every pair of distinct fake devices is peer-capable with native atomics
   * (as NVLink-connected GPUs report). */
  *value = src != dst && attrib != SM_CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuDeviceTotalMem_v2(size_t *bytes, sm_CUdevice dev) {
  NEED_INIT;
  NEED_DEVICE(dev);
  *bytes = fake_capacity;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuDeviceCanAccessPeer(int *canAccessPeer, sm_CUdevice dev, sm_CUdevice peerDev) {
  NEED_INIT;
  NEED_DEVICE(dev);
  NEED_DEVICE(peerDev);
  *canAccessPeer = dev != peerDev;
  return SM_CUDA_SUCCESS;
}

/* ---- contexts ---------------------------------------------------------------- */

struct CUctx_st {
  int dev;
  int refs;
};
static struct CUctx_st fake_ctx[FAKE_MAX_DEVICES];
/* initial-exec: see export/errors.c (LeakSanitizer and dynamic TLS). */
static __thread __attribute__((tls_model("initial-exec"))) sm_CUcontext fake_current;

#define NEED_CTX                                                                           \
  NEED_INIT;                                                                               \
  if (fake_current == NULL)                                                                \
  return FAKE_INVALID_CONTEXT

sm_CUresult cuDevicePrimaryCtxRetain(sm_CUcontext *pctx, sm_CUdevice dev) {
  NEED_INIT;
  NEED_DEVICE(dev);
  pthread_mutex_lock(&fake_mu);
  fake_ctx[dev].dev = dev;
  fake_ctx[dev].refs++;
  pthread_mutex_unlock(&fake_mu);
  *pctx = &fake_ctx[dev];
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuDevicePrimaryCtxRelease_v2(sm_CUdevice dev) {
  NEED_INIT;
  NEED_DEVICE(dev);
  sm_CUresult r = SM_CUDA_SUCCESS;
  pthread_mutex_lock(&fake_mu);
  if (fake_ctx[dev].refs == 0)
    r = FAKE_INVALID_CONTEXT;
  else
    fake_ctx[dev].refs--;
  pthread_mutex_unlock(&fake_mu);
  return r;
}

sm_CUresult cuCtxGetCurrent(sm_CUcontext *pctx) {
  NEED_INIT;
  *pctx = fake_current;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuCtxSetCurrent(sm_CUcontext ctx) {
  NEED_INIT;
  fake_current = ctx;
  return SM_CUDA_SUCCESS;
}

/* ---- physical memory ------------------------------------------------------- */

/* The stand-in's fabric handle: 64 bytes, as CUmemFabricHandle. */
#define FAKE_FABRIC_MAGIC 0x62616673656b6166ull /* "fakesfab" */
typedef struct {
  uint64_t magic;
  uint32_t pid;
  int32_t fd;
  uint64_t size;
  unsigned char reserved[40];
} fake_fabric_handle;
_Static_assert(sizeof(fake_fabric_handle) == 64, "a fabric handle is 64 bytes");

sm_CUresult cuDeviceGetFabricClusterUuid(sm_CUuuid *uuid, sm_CUdevice dev) {
  NEED_INIT;
  NEED_DEVICE(dev);
  const char *c = getenv("FAKECUDA_FABRIC_CLUSTER");
  if (c == NULL || *c == 0)
    return SM_CUDA_ERROR_NOT_SUPPORTED;
  memset(uuid, 0, sizeof *uuid);
  for (size_t i = 0; c[i] != 0; i++)
    ((unsigned char *)uuid)[i % 16] ^= (unsigned char)(c[i] * (i + 1));
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuDeviceGetCliqueInfo(sm_CUcliqueInfo *info, size_t *count, sm_CUdevice dev) {
  NEED_INIT;
  NEED_DEVICE(dev);
  const char *c = getenv("FAKECUDA_FABRIC_CLUSTER");
  if (c == NULL || *c == 0)
    return SM_CUDA_ERROR_NOT_SUPPORTED;
  if (count == NULL || (*count > 0 && info == NULL))
    return SM_CUDA_ERROR_INVALID_VALUE;
  const char *q = getenv("FAKECUDA_FABRIC_CLIQUE");
  if (*count > 0) {
    info[0].type = 0; /* unicast pointer */
    info[0].id = q != NULL ? (unsigned int)strtoul(q, NULL, 10) : 0;
  }
  *count = 1;
  return SM_CUDA_SUCCESS;
}

static struct {
  int live;
  int fd;
  size_t size;
  int dev; /* -1 for imported memory, which is not counted */
  int fabric; /* created with FABRIC among its handle types */
} fake_alloc[FAKE_MAX_ALLOCS];

static sm_CUresult fake_check_prop(const sm_CUmemAllocationProp *prop) {
  static const unsigned char zero[sizeof prop->allocFlags];
  if (prop->type != SM_CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != SM_CU_MEM_LOCATION_TYPE_DEVICE || prop->win32HandleMetaData != NULL ||
      memcmp(&prop->allocFlags, zero, sizeof zero) != 0 ||
      (prop->requestedHandleTypes &
       ~(SM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | SM_CU_MEM_HANDLE_TYPE_FABRIC)) != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  NEED_DEVICE(prop->location.id);
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuMemGetAllocationGranularity(size_t *granularity, const sm_CUmemAllocationProp *prop,
                                          sm_CUmemAllocationGranularity_flags option) {
  NEED_INIT;
  sm_CUresult r = fake_check_prop(prop);
  if (r != SM_CUDA_SUCCESS)
    return r;
  if (option != SM_CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
      option != SM_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return SM_CUDA_ERROR_INVALID_VALUE;
  *granularity = FAKE_GRANULARITY;
  return SM_CUDA_SUCCESS;
}

static sm_CUresult fake_new_handle(int fd, size_t size, int dev, sm_CUmemGenericAllocationHandle *h) {
  for (int i = 0; i < FAKE_MAX_ALLOCS; i++) {
    if (!fake_alloc[i].live) {
      fake_alloc[i].live = 1;
      fake_alloc[i].fd = fd;
      fake_alloc[i].size = size;
      fake_alloc[i].dev = dev;
      fake_alloc[i].fabric = 0;
      *h = (sm_CUmemGenericAllocationHandle)(0x10000 + i);
      return SM_CUDA_SUCCESS;
    }
  }
  return SM_CUDA_ERROR_OUT_OF_MEMORY;
}

/* The slot of h, or -1; call with fake_mu held. */
static int fake_slot(sm_CUmemGenericAllocationHandle h) {
  if (h < 0x10000 || h >= 0x10000 + FAKE_MAX_ALLOCS || !fake_alloc[h - 0x10000].live)
    return -1;
  return (int)(h - 0x10000);
}

#ifndef FAKECUDA_NO_MEMCREATE
sm_CUresult cuMemCreate(sm_CUmemGenericAllocationHandle *handle, size_t size,
                        const sm_CUmemAllocationProp *prop, unsigned long long flags) {
  NEED_CTX;
  sm_CUresult r = fake_check_prop(prop);
  if (r != SM_CUDA_SUCCESS)
    return r;
  if (flags != 0 || size == 0 || size % FAKE_GRANULARITY != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  if ((prop->requestedHandleTypes & SM_CU_MEM_HANDLE_TYPE_FABRIC) &&
      getenv("FAKECUDA_FABRIC_OK") == NULL)
    return SM_CUDA_ERROR_NOT_PERMITTED;
  int dev = prop->location.id;
  pthread_mutex_lock(&fake_mu);
  if (size > fake_capacity - fake_used[dev]) {
    pthread_mutex_unlock(&fake_mu);
    return SM_CUDA_ERROR_OUT_OF_MEMORY;
  }
  int fd = memfd_create("fakecuda", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
    if (fd >= 0)
      close(fd);
    pthread_mutex_unlock(&fake_mu);
    return SM_CUDA_ERROR_OUT_OF_MEMORY;
  }
  r = fake_new_handle(fd, size, dev, handle);
  if (r == SM_CUDA_SUCCESS) {
    fake_used[dev] += size;
    fake_alloc[*handle - 0x10000].fabric = (prop->requestedHandleTypes & SM_CU_MEM_HANDLE_TYPE_FABRIC) != 0;
  }
  else
    close(fd);
  pthread_mutex_unlock(&fake_mu);
  return r;
}
#endif

sm_CUresult cuMemRelease(sm_CUmemGenericAllocationHandle handle) {
  NEED_CTX;
  pthread_mutex_lock(&fake_mu);
  int i = fake_slot(handle);
  if (i < 0) {
    pthread_mutex_unlock(&fake_mu);
    return SM_CUDA_ERROR_INVALID_VALUE;
  }
  /* Mappings keep the memfd alive, as mappings keep GPU memory alive. */
  close(fake_alloc[i].fd);
  if (fake_alloc[i].dev >= 0)
    fake_used[fake_alloc[i].dev] -= fake_alloc[i].size;
  fake_alloc[i].live = 0;
  pthread_mutex_unlock(&fake_mu);
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuMemGetInfo_v2(size_t *freeBytes, size_t *totalBytes) {
  NEED_CTX;
  pthread_mutex_lock(&fake_mu);
  *totalBytes = fake_capacity;
  *freeBytes = fake_capacity - fake_used[fake_current->dev];
  pthread_mutex_unlock(&fake_mu);
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuMemExportToShareableHandle(void *shareableHandle, sm_CUmemGenericAllocationHandle handle,
                                         sm_CUmemAllocationHandleType handleType,
                                         unsigned long long flags) {
  NEED_CTX;
  if (handleType == SM_CU_MEM_HANDLE_TYPE_FABRIC && flags == 0) {
    pthread_mutex_lock(&fake_mu);
    int i = fake_slot(handle);
    int ok = i >= 0 && fake_alloc[i].fabric;
    fake_fabric_handle h = {FAKE_FABRIC_MAGIC, (uint32_t)getpid(), ok ? fake_alloc[i].fd : -1,
                            ok ? (uint64_t)fake_alloc[i].size : 0, {0}};
    pthread_mutex_unlock(&fake_mu);
    if (!ok)
      return SM_CUDA_ERROR_INVALID_VALUE; /* not created with FABRIC */
    memcpy(shareableHandle, &h, sizeof h);
    return SM_CUDA_SUCCESS;
  }
  if (handleType != SM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_mu);
  int i = fake_slot(handle);
  int fd = i < 0 ? -1 : fcntl(fake_alloc[i].fd, F_DUPFD_CLOEXEC, 0);
  pthread_mutex_unlock(&fake_mu);
  if (i < 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  if (fd < 0)
    return SM_CUDA_ERROR_OUT_OF_MEMORY;
  *(int *)shareableHandle = fd;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuMemImportFromShareableHandle(sm_CUmemGenericAllocationHandle *handle, void *osHandle,
                                           sm_CUmemAllocationHandleType shHandleType) {
  NEED_CTX;
  int fd;
  if (shHandleType == SM_CU_MEM_HANDLE_TYPE_FABRIC) {
    fake_fabric_handle h;
    memcpy(&h, osHandle, sizeof h);
    if (h.magic != FAKE_FABRIC_MAGIC || h.fd < 0)
      return SM_CUDA_ERROR_INVALID_VALUE;
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%d", h.pid, h.fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
      return errno == ENOENT ? SM_CUDA_ERROR_INVALID_VALUE : SM_CUDA_ERROR_NOT_PERMITTED;
  } else if (shHandleType == SM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    fd = fcntl((int)(intptr_t)osHandle, F_DUPFD_CLOEXEC, 0); /* the caller keeps its fd */
  } else {
    return SM_CUDA_ERROR_INVALID_VALUE;
  }
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
    if (fd >= 0)
      close(fd);
    return SM_CUDA_ERROR_INVALID_VALUE;
  }
  pthread_mutex_lock(&fake_mu);
  sm_CUresult r = fake_new_handle(fd, (size_t)st.st_size, -1, handle);
  pthread_mutex_unlock(&fake_mu);
  if (r != SM_CUDA_SUCCESS)
    close(fd);
  return r;
}

/* ---- address space --------------------------------------------------------- */

sm_CUresult cuMemAddressReserve(sm_CUdeviceptr *ptr, size_t size, size_t alignment,
                                sm_CUdeviceptr addr, unsigned long long flags) {
  NEED_CTX;
  if (size == 0 || size % FAKE_GRANULARITY != 0 || addr != 0 || flags != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  if (alignment == 0)
    alignment = FAKE_GRANULARITY;
  char *p = mmap(NULL, size + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return SM_CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t start = ((uintptr_t)p + alignment - 1) / alignment * alignment;
  if (start > (uintptr_t)p)
    munmap(p, start - (uintptr_t)p);
  uintptr_t end = (uintptr_t)p + size + alignment;
  if (end > start + size)
    munmap((void *)(start + size), end - (start + size));
  *ptr = start;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuMemAddressFree(sm_CUdeviceptr ptr, size_t size) {
  NEED_CTX;
  if (ptr % FAKE_GRANULARITY != 0 || size == 0 || munmap((void *)(uintptr_t)ptr, size) != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuMemMap(sm_CUdeviceptr ptr, size_t size, size_t offset,
                     sm_CUmemGenericAllocationHandle handle, unsigned long long flags) {
  NEED_CTX;
  if (flags != 0 || ptr % FAKE_GRANULARITY != 0 || size == 0 || size % FAKE_GRANULARITY != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_mu);
  int i = fake_slot(handle);
  if (i < 0 || offset + size > fake_alloc[i].size) {
    pthread_mutex_unlock(&fake_mu);
    return SM_CUDA_ERROR_INVALID_VALUE;
  }
  void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, fake_alloc[i].fd,
                 (off_t)offset);
  pthread_mutex_unlock(&fake_mu);
  return p == MAP_FAILED ? SM_CUDA_ERROR_INVALID_VALUE : SM_CUDA_SUCCESS;
}

/* The devices each mapped range grants access to (a bit per device), for
 * cuMemGetAccess; a range is forgotten when an unmap overlaps it. */
static struct {
  sm_CUdeviceptr ptr;
  size_t size;
  unsigned mask;
} fake_access[FAKE_MAX_ALLOCS];

static void fake_forget_access(sm_CUdeviceptr ptr, size_t size) {
  for (int i = 0; i < FAKE_MAX_ALLOCS; i++)
    if (fake_access[i].size != 0 && fake_access[i].ptr < ptr + size &&
        ptr < fake_access[i].ptr + fake_access[i].size)
      fake_access[i].size = 0;
}

sm_CUresult cuMemSetAccess(sm_CUdeviceptr ptr, size_t size, const sm_CUmemAccessDesc *desc, size_t count) {
  NEED_CTX;
  if (count == 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  unsigned mask = 0;
  for (size_t i = 0; i < count; i++) {
    if (desc[i].location.type != SM_CU_MEM_LOCATION_TYPE_DEVICE ||
        desc[i].flags != SM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return SM_CUDA_ERROR_INVALID_VALUE;
    NEED_DEVICE(desc[i].location.id);
    mask |= 1u << desc[i].location.id;
  }
  if (mprotect((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE) != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_mu);
  fake_forget_access(ptr, size);
  for (int i = 0; i < FAKE_MAX_ALLOCS; i++)
    if (fake_access[i].size == 0) {
      fake_access[i].ptr = ptr;
      fake_access[i].size = size;
      fake_access[i].mask = mask;
      break;
    }
  pthread_mutex_unlock(&fake_mu);
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuMemGetAccess(unsigned long long *flags, const sm_CUmemLocation *location, sm_CUdeviceptr ptr) {
  NEED_CTX;
  if (flags == NULL || location == NULL || location->type != SM_CU_MEM_LOCATION_TYPE_DEVICE)
    return SM_CUDA_ERROR_INVALID_VALUE;
  NEED_DEVICE(location->id);
  sm_CUresult r = SM_CUDA_ERROR_INVALID_VALUE; /* not a mapped address */
  pthread_mutex_lock(&fake_mu);
  for (int i = 0; i < FAKE_MAX_ALLOCS; i++)
    if (fake_access[i].size != 0 && ptr >= fake_access[i].ptr &&
        ptr < fake_access[i].ptr + fake_access[i].size) {
      *flags = fake_access[i].mask & (1u << location->id) ? SM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE : 0;
      r = SM_CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&fake_mu);
  return r;
}

sm_CUresult cuMemUnmap(sm_CUdeviceptr ptr, size_t size) {
  NEED_CTX;
  if (ptr % FAKE_GRANULARITY != 0 || size == 0 || size % FAKE_GRANULARITY != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_mu);
  fake_forget_access(ptr, size);
  pthread_mutex_unlock(&fake_mu);
  /* Back to reserved: an inaccessible private mapping at the same place. */
  void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? SM_CUDA_ERROR_INVALID_VALUE : SM_CUDA_SUCCESS;
}

/* ---- streams and events ---------------------------------------------------- */

struct CUevent_st {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned long long recorded, completed;
};

enum fake_op_kind { OP_MEMSET, OP_COPY, OP_WRITE32, OP_WAIT32_EQ, OP_WAIT32_GEQ, OP_RECORD, OP_WAIT_EVENT };

struct fake_op {
  enum fake_op_kind kind;
  void *dst;
  const void *src;
  size_t n;
  uint32_t value;
  struct CUevent_st *ev;
  unsigned long long seq;
  struct fake_op *next;
};

struct CUstream_st {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct fake_op *head, *tail;
  int busy, quit;
  struct CUstream_st *all_next;
};

static struct CUstream_st *fake_streams; /* every stream, for cuCtxSynchronize */
static struct CUstream_st *fake_legacy;

static void fake_run(struct fake_op *op) {
  switch (op->kind) {
  case OP_MEMSET:
    memset(op->dst, (int)op->value, op->n);
    break;
  case OP_COPY:
    memmove(op->dst, op->src, op->n);
    break;
  case OP_WRITE32:
    __atomic_store_n((uint32_t *)op->dst, op->value, __ATOMIC_SEQ_CST);
    break;
  case OP_WAIT32_EQ:
  case OP_WAIT32_GEQ:
    for (;;) {
      uint32_t v = __atomic_load_n((uint32_t *)op->dst, __ATOMIC_SEQ_CST);
      if (op->kind == OP_WAIT32_EQ ? v == op->value : (int32_t)(v - op->value) >= 0)
        break;
      struct timespec ts = {0, 50000};
      nanosleep(&ts, NULL);
    }
    break;
  case OP_RECORD:
    pthread_mutex_lock(&op->ev->mu);
    if (op->seq > op->ev->completed)
      op->ev->completed = op->seq;
    pthread_cond_broadcast(&op->ev->cv);
    pthread_mutex_unlock(&op->ev->mu);
    break;
  case OP_WAIT_EVENT:
    pthread_mutex_lock(&op->ev->mu);
    while (op->ev->completed < op->seq)
      pthread_cond_wait(&op->ev->cv, &op->ev->mu);
    pthread_mutex_unlock(&op->ev->mu);
    break;
  }
}

static void *fake_worker(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (s->head == NULL && !s->quit)
      pthread_cond_wait(&s->cv, &s->mu);
    if (s->head == NULL)
      break; /* destroyed and drained */
    struct fake_op *op = s->head;
    s->head = op->next;
    if (s->head == NULL)
      s->tail = NULL;
    s->busy = 1;
    pthread_mutex_unlock(&s->mu);
    fake_run(op);
    free(op);
    pthread_mutex_lock(&s->mu);
    s->busy = 0;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static struct CUstream_st *fake_new_stream(void) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_t th;
  if (pthread_create(&th, NULL, fake_worker, s) != 0) {
    free(s);
    return NULL;
  }
  pthread_detach(th);
  pthread_mutex_lock(&fake_mu);
  s->all_next = fake_streams;
  fake_streams = s;
  pthread_mutex_unlock(&fake_mu);
  return s;
}

static pthread_once_t fake_legacy_once = PTHREAD_ONCE_INIT;
static void fake_make_legacy(void) { fake_legacy = fake_new_stream(); }

/* NULL, CU_STREAM_LEGACY (0x1) and CU_STREAM_PER_THREAD (0x2) are the default stream. */
static struct CUstream_st *fake_stream(sm_CUstream s) {
  if ((uintptr_t)s <= 2) {
    pthread_once(&fake_legacy_once, fake_make_legacy);
    return fake_legacy;
  }
  return s;
}

static sm_CUresult fake_enqueue(sm_CUstream hs, struct fake_op o) {
  struct CUstream_st *s = fake_stream(hs);
  struct fake_op *op = malloc(sizeof *op);
  if (s == NULL || op == NULL) {
    free(op);
    return SM_CUDA_ERROR_OUT_OF_MEMORY;
  }
  *op = o;
  op->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->tail != NULL)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return SM_CUDA_SUCCESS;
}

static void fake_drain(struct CUstream_st *s) {
  pthread_mutex_lock(&s->mu);
  while (s->head != NULL || s->busy)
    pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

sm_CUresult cuStreamCreate(sm_CUstream *phStream, unsigned int Flags) {
  NEED_CTX;
  if (Flags != SM_CU_STREAM_DEFAULT && Flags != SM_CU_STREAM_NON_BLOCKING)
    return SM_CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st *s = fake_new_stream();
  if (s == NULL)
    return SM_CUDA_ERROR_OUT_OF_MEMORY;
  *phStream = s;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuStreamDestroy_v2(sm_CUstream hStream) {
  NEED_CTX;
  if ((uintptr_t)hStream <= 2)
    return FAKE_INVALID_HANDLE;
  pthread_mutex_lock(&hStream->mu);
  hStream->quit = 1; /* the worker drains the queue, then exits; the struct is kept */
  pthread_cond_broadcast(&hStream->cv);
  pthread_mutex_unlock(&hStream->mu);
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuStreamSynchronize(sm_CUstream hStream) {
  NEED_CTX;
  struct CUstream_st *s = fake_stream(hStream);
  if (s == NULL)
    return SM_CUDA_ERROR_OUT_OF_MEMORY;
  fake_drain(s);
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuCtxSynchronize(void) {
  NEED_CTX;
  pthread_mutex_lock(&fake_mu);
  struct CUstream_st *all = fake_streams;
  pthread_mutex_unlock(&fake_mu);
  for (struct CUstream_st *s = all; s != NULL; s = s->all_next)
    fake_drain(s);
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuEventCreate(sm_CUevent *phEvent, unsigned int Flags) {
  NEED_CTX;
  (void)Flags;
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (e == NULL)
    return SM_CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  *phEvent = e;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuEventRecord(sm_CUevent hEvent, sm_CUstream hStream) {
  NEED_CTX;
  pthread_mutex_lock(&hEvent->mu);
  unsigned long long seq = ++hEvent->recorded;
  pthread_mutex_unlock(&hEvent->mu);
  return fake_enqueue(hStream, (struct fake_op){.kind = OP_RECORD, .ev = hEvent, .seq = seq});
}

sm_CUresult cuStreamWaitEvent(sm_CUstream hStream, sm_CUevent hEvent, unsigned int Flags) {
  NEED_CTX;
  if (Flags != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&hEvent->mu);
  unsigned long long seq = hEvent->recorded;
  pthread_mutex_unlock(&hEvent->mu);
  return fake_enqueue(hStream, (struct fake_op){.kind = OP_WAIT_EVENT, .ev = hEvent, .seq = seq});
}

sm_CUresult cuEventDestroy_v2(sm_CUevent hEvent) {
  NEED_CTX;
  (void)hEvent; /* kept: queued operations may still refer to it */
  return SM_CUDA_SUCCESS;
}

/* An asynchronous fill or copy naming address 0 is refused when it is
 * queued (CUDA_ERROR_INVALID_VALUE): how tests make the driver refuse one op
 * of a batch. */
sm_CUresult cuMemsetD8Async(sm_CUdeviceptr dstDevice, unsigned char uc, size_t N, sm_CUstream hStream) {
  NEED_CTX;
  if (dstDevice == 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  return fake_enqueue(hStream, (struct fake_op){.kind = OP_MEMSET, .dst = (void *)(uintptr_t)dstDevice,
                                                .n = N, .value = uc});
}

sm_CUresult cuMemcpyAsync(sm_CUdeviceptr dst, sm_CUdeviceptr src, size_t ByteCount, sm_CUstream hStream) {
  NEED_CTX;
  if (dst == 0 || src == 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  return fake_enqueue(hStream,
                      (struct fake_op){.kind = OP_COPY, .dst = (void *)(uintptr_t)dst,
                                       .src = (const void *)(uintptr_t)src, .n = ByteCount});
}

/* The calling thread's stream-capture interaction mode. Nothing captures
 * here; with FAKECUDA_CAPTURING set, the fake behaves as if another thread
 * were capturing a graph in global mode: cuMemHostAlloc, a call that such a
 * capture prohibits, fails unless this thread is in the relaxed mode. */
static __thread sm_CUstreamCaptureMode fake_capture_mode = SM_CU_STREAM_CAPTURE_MODE_GLOBAL;
#define FAKE_ERROR_STREAM_CAPTURE_UNSUPPORTED 900

/* Pinned host memory: plain memory here (the fake's copies are memcpy). */
sm_CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
  NEED_CTX;
  if (pp == NULL || (Flags & ~0x0Fu) != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  if (getenv("FAKECUDA_CAPTURING") != NULL && fake_capture_mode != SM_CU_STREAM_CAPTURE_MODE_RELAXED)
    return (sm_CUresult)FAKE_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  *pp = bytesize ? malloc(bytesize) : NULL;
  return *pp || !bytesize ? SM_CUDA_SUCCESS : SM_CUDA_ERROR_OUT_OF_MEMORY;
}

sm_CUresult cuThreadExchangeStreamCaptureMode(sm_CUstreamCaptureMode *mode) {
  if (mode == NULL || *mode < SM_CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > SM_CU_STREAM_CAPTURE_MODE_RELAXED)
    return SM_CUDA_ERROR_INVALID_VALUE;
  sm_CUstreamCaptureMode old = fake_capture_mode;
  fake_capture_mode = *mode;
  *mode = old;
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuMemFreeHost(void *p) {
  NEED_CTX;
  free(p);
  return SM_CUDA_SUCCESS;
}

sm_CUresult cuStreamWriteValue32_v2(sm_CUstream stream, sm_CUdeviceptr addr, sm_cuuint32_t value,
                                    unsigned int flags) {
  NEED_CTX;
  if (flags != SM_CU_STREAM_WRITE_VALUE_DEFAULT || addr % 4 != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  return fake_enqueue(stream, (struct fake_op){.kind = OP_WRITE32, .dst = (void *)(uintptr_t)addr,
                                               .value = value});
}

sm_CUresult cuStreamWaitValue32_v2(sm_CUstream stream, sm_CUdeviceptr addr, sm_cuuint32_t value,
                                   unsigned int flags) {
  NEED_CTX;
  if ((flags != SM_CU_STREAM_WAIT_VALUE_EQ && flags != SM_CU_STREAM_WAIT_VALUE_GEQ) || addr % 4 != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  return fake_enqueue(stream,
                      (struct fake_op){.kind = flags == SM_CU_STREAM_WAIT_VALUE_EQ ? OP_WAIT32_EQ : OP_WAIT32_GEQ,
                                       .dst = (void *)(uintptr_t)addr, .value = value});
}

sm_CUresult cuStreamBatchMemOp_v2(sm_CUstream stream, unsigned int count,
                                  sm_CUstreamBatchMemOpParams *params, unsigned int flags) {
  NEED_CTX;
  if (count == 0 || count >= 256 || flags != 0)
    return SM_CUDA_ERROR_INVALID_VALUE;
  for (unsigned int i = 0; i < count; i++) {
    sm_CUresult r;
    switch (params[i].operation) {
    case SM_CU_STREAM_MEM_OP_WAIT_VALUE_32:
      r = cuStreamWaitValue32_v2(stream, params[i].waitValue.address, params[i].waitValue.value,
                                 params[i].waitValue.flags);
      break;
    case SM_CU_STREAM_MEM_OP_WRITE_VALUE_32:
      r = cuStreamWriteValue32_v2(stream, params[i].writeValue.address, params[i].writeValue.value,
                                  params[i].writeValue.flags);
      break;
    default:
      r = SM_CUDA_ERROR_INVALID_VALUE;
    }
    if (r != SM_CUDA_SUCCESS)
      return r;
  }
  return SM_CUDA_SUCCESS;
}

/* Kernels cannot run here: module loading and launches are refused as a
 * driver without the feature would refuse them. */
sm_CUresult cuModuleLoadData(sm_CUmodule *module, const void *image) {
  (void)image;
  NEED_CTX;
  *module = NULL;
  return SM_CUDA_ERROR_NOT_SUPPORTED;
}

sm_CUresult cuModuleUnload(sm_CUmodule hmod) {
  (void)hmod;
  return SM_CUDA_ERROR_INVALID_VALUE;
}

sm_CUresult cuModuleGetFunction(sm_CUfunction *hfunc, sm_CUmodule hmod, const char *name) {
  (void)hmod;
  (void)name;
  *hfunc = NULL;
  return SM_CUDA_ERROR_INVALID_VALUE;
}

sm_CUresult cuLaunchKernel(sm_CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                           unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                           unsigned int sharedMemBytes, sm_CUstream hStream, void **kernelParams, void **extra) {
  (void)f, (void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX, (void)blockDimY, (void)blockDimZ;
  (void)sharedMemBytes, (void)hStream, (void)kernelParams, (void)extra;
  return SM_CUDA_ERROR_NOT_SUPPORTED;
}
