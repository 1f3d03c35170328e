/*
 * abi_check.c - checks cuda/driver.h, our hand-written subset of the CUDA
 * driver API, against the real <cuda.h>, and the versioned symbol names
 * against the installed driver. Build and run it with run.sh on a machine
 * with the CUDA headers (and, for the last part, the driver).
 *
 * It checks, printing one line per check:
 *   1. sizeof of every type, offsetof of every struct field, value of every
 *      enum constant that driver.h declares, against cuda.h;
 *   2. every function of SM_CU_FUNCTIONS: that its signature (with the real
 *      types) is compatible with cuda.h's declaration, and that cuda.h maps
 *      the documented name to the versioned symbol we dlsym (for example
 *      "#define cuMemGetInfo cuMemGetInfo_v2");
 *   3. that libcuda.so.1 (or $SYMMEM_LIBCUDA) exports every such symbol.
 * It exits 1 if any check fails, 0 otherwise.
 */
#include <cuda.h>

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

static int checks, failures;

static void report(int ok, const char *what, const char *detail) {
  checks++;
  if (!ok)
    failures++;
  printf("%-5s %-72s %s\n", ok ? "ok" : "FAIL", what, detail);
}

static void check_eq(const char *what, long long ours, long long theirs) {
  char detail[96];
  snprintf(detail, sizeof detail, "driver.h=%lld cuda.h=%lld", ours, theirs);
  report(ours == theirs, what, detail);
}

#define STR(x) #x
#define XSTR(x) STR(x)

/* sizeof(sm_T) == sizeof(T) */
#define SIZE(T) check_eq("sizeof(" #T ")", (long long)sizeof(sm_##T), (long long)sizeof(T))
/* offsetof(sm_T, f) == offsetof(T, f) */
#define OFFSET(T, f)                                                                       \
  check_eq("offsetof(" #T ", " #f ")", (long long)offsetof(sm_##T, f), (long long)offsetof(T, f))
/* SM_NAME == NAME */
#define VALUE(NAME) check_eq(#NAME, (long long)SM_##NAME, (long long)NAME)

/* The real types, for SM_CU_FUNCTIONS. */
#define REAL_TYPE(name) name

static void check_function(const char *api, const char *api_expanded, const char *symbol,
                           int compatible) {
  char what[160];
  snprintf(what, sizeof what, "%s: signature matches cuda.h", symbol);
  report(compatible, what, "");
  snprintf(what, sizeof what, "%s: cuda.h maps %s to it", symbol, api);
  char detail[128];
  snprintf(detail, sizeof detail, "cuda.h: %s -> %s", api, api_expanded);
  report(strcmp(api_expanded, symbol) == 0, what, detail);
}

/* __builtin_types_compatible_p compares the declaration cuda.h gives the
 * versioned symbol with the signature driver.h lists, types made real. */
#define CHECK_FUNCTION(api, symbol, params)                                                \
  check_function(#api, XSTR(api), #symbol,                                                 \
                 __builtin_types_compatible_p(__typeof__(&symbol), CUresult(*) params));

static void check_types(void) {
  printf("== types (CUDA_VERSION %d)\n", CUDA_VERSION);
  SIZE(cuuint32_t);
  SIZE(CUdevice);
  SIZE(CUdeviceptr);
  SIZE(CUmemGenericAllocationHandle);
  SIZE(CUcontext);
  SIZE(CUstream);
  SIZE(CUevent);
  SIZE(CUmodule);
  SIZE(CUfunction);
  SIZE(CUuuid);
  OFFSET(CUuuid, bytes);
  SIZE(CUresult);
  SIZE(CUdevice_attribute);
  SIZE(CUdevice_P2PAttribute);
  SIZE(CUmemAllocationType);
  SIZE(CUmemAllocationHandleType);
  SIZE(CUmemLocationType);
  SIZE(CUmemAccess_flags);
  SIZE(CUmemAllocationGranularity_flags);
  SIZE(CUstreamCaptureMode);

  SIZE(CUmemLocation);
  OFFSET(CUmemLocation, type);
  OFFSET(CUmemLocation, id);

  SIZE(CUmemAllocationProp);
  OFFSET(CUmemAllocationProp, type);
  OFFSET(CUmemAllocationProp, requestedHandleTypes);
  OFFSET(CUmemAllocationProp, location);
  OFFSET(CUmemAllocationProp, location.type);
  OFFSET(CUmemAllocationProp, location.id);
  OFFSET(CUmemAllocationProp, win32HandleMetaData);
  OFFSET(CUmemAllocationProp, allocFlags);
  OFFSET(CUmemAllocationProp, allocFlags.compressionType);
  OFFSET(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable);
  OFFSET(CUmemAllocationProp, allocFlags.usage);
  OFFSET(CUmemAllocationProp, allocFlags.reserved);
  check_eq("sizeof(CUmemAllocationProp.allocFlags)", (long long)sizeof(((sm_CUmemAllocationProp *)0)->allocFlags),
           (long long)sizeof(((CUmemAllocationProp *)0)->allocFlags));

  SIZE(CUmemAccessDesc);
  OFFSET(CUmemAccessDesc, location);
  OFFSET(CUmemAccessDesc, flags);

  SIZE(CUlaunchAttributeValue);
  OFFSET(CUlaunchAttributeValue, programmaticStreamSerializationAllowed);
  SIZE(CUlaunchAttribute);
  OFFSET(CUlaunchAttribute, id);
  OFFSET(CUlaunchAttribute, value);
  VALUE(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
  SIZE(CUlaunchConfig);
  OFFSET(CUlaunchConfig, gridDimX);
  OFFSET(CUlaunchConfig, blockDimX);
  OFFSET(CUlaunchConfig, sharedMemBytes);
  OFFSET(CUlaunchConfig, hStream);
  OFFSET(CUlaunchConfig, attrs);
  OFFSET(CUlaunchConfig, numAttrs);

  SIZE(CUstreamBatchMemOpParams);
  OFFSET(CUstreamBatchMemOpParams, operation);
  OFFSET(CUstreamBatchMemOpParams, waitValue.operation);
  OFFSET(CUstreamBatchMemOpParams, waitValue.address);
  OFFSET(CUstreamBatchMemOpParams, waitValue.value);
  OFFSET(CUstreamBatchMemOpParams, waitValue.value64);
  OFFSET(CUstreamBatchMemOpParams, waitValue.flags);
  OFFSET(CUstreamBatchMemOpParams, waitValue.alias);
  OFFSET(CUstreamBatchMemOpParams, writeValue.operation);
  OFFSET(CUstreamBatchMemOpParams, writeValue.address);
  OFFSET(CUstreamBatchMemOpParams, writeValue.value);
  OFFSET(CUstreamBatchMemOpParams, writeValue.flags);
  OFFSET(CUstreamBatchMemOpParams, writeValue.alias);
}

static void check_values(void) {
  printf("== enum values\n");
  VALUE(CUDA_SUCCESS);
  VALUE(CUDA_ERROR_INVALID_VALUE);
  VALUE(CUDA_ERROR_OUT_OF_MEMORY);
  VALUE(CUDA_ERROR_NOT_INITIALIZED);
  VALUE(CUDA_ERROR_DEINITIALIZED);
  VALUE(CUDA_ERROR_NO_DEVICE);
  VALUE(CUDA_ERROR_INVALID_DEVICE);
  VALUE(CUDA_ERROR_NOT_PERMITTED);
  VALUE(CUDA_ERROR_NOT_SUPPORTED);
  VALUE(CU_MEMHOSTALLOC_PORTABLE);

  VALUE(CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK);
  VALUE(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED);
  VALUE(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED);
  VALUE(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  VALUE(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  VALUE(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
  VALUE(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
  VALUE(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
  VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  VALUE(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
  VALUE(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
#if CUDA_VERSION >= 12030
  VALUE(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED);
  VALUE(CU_MEM_HANDLE_TYPE_FABRIC);
#else
  printf("skip  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, CU_MEM_HANDLE_TYPE_FABRIC (CUDA < 12.3)\n");
#endif
#if CUDA_VERSION >= 12010
  VALUE(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED);
#else
  printf("skip  CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED (CUDA < 12.1)\n");
#endif

  VALUE(CU_MEM_ALLOCATION_TYPE_INVALID);
  VALUE(CU_MEM_ALLOCATION_TYPE_PINNED);
  VALUE(CU_MEM_HANDLE_TYPE_NONE);
  VALUE(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  VALUE(CU_MEM_LOCATION_TYPE_INVALID);
  VALUE(CU_MEM_LOCATION_TYPE_DEVICE);
  VALUE(CU_MEM_ACCESS_FLAGS_PROT_NONE);
  VALUE(CU_MEM_ACCESS_FLAGS_PROT_READ);
  VALUE(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  VALUE(CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  VALUE(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);

  VALUE(CU_STREAM_DEFAULT);
  VALUE(CU_STREAM_NON_BLOCKING);
  VALUE(CU_STREAM_CAPTURE_MODE_GLOBAL);
  VALUE(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  VALUE(CU_STREAM_CAPTURE_MODE_RELAXED);
  VALUE(CU_EVENT_DEFAULT);
  VALUE(CU_EVENT_DISABLE_TIMING);
  VALUE(CU_STREAM_WAIT_VALUE_GEQ);
  VALUE(CU_STREAM_WAIT_VALUE_EQ);
  VALUE(CU_STREAM_WRITE_VALUE_DEFAULT);
  VALUE(CU_STREAM_MEM_OP_WAIT_VALUE_32);
  VALUE(CU_STREAM_MEM_OP_WRITE_VALUE_32);
}

static void check_functions(void) {
  printf("== functions\n");
  SM_CU_FUNCTIONS(CHECK_FUNCTION, REAL_TYPE)
  /* For information: what the header does with the unversioned UUID name. */
  printf("info  cuda.h: cuDeviceGetUuid -> %s\n", XSTR(cuDeviceGetUuid));
}

static void check_driver(void) {
  const char *path = getenv("SYMMEM_LIBCUDA");
  if (path == NULL || *path == '\0')
    path = "libcuda.so.1";
  printf("== symbols exported by %s\n", path);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    report(0, "dlopen of the driver", dlerror());
    return;
  }
#define CHECK_SYMBOL(api, symbol, params) report(dlsym(h, #symbol) != NULL, "dlsym " #symbol, "");
  SM_CU_FUNCTIONS(CHECK_SYMBOL, REAL_TYPE)
#undef CHECK_SYMBOL
  int version = 0;
  CUresult (*get_version)(int *) = NULL;
  void *p = dlsym(h, "cuDriverGetVersion");
  memcpy(&get_version, &p, sizeof p);
  if (get_version != NULL && get_version(&version) == CUDA_SUCCESS)
    printf("info  the driver supports CUDA %d.%d\n", version / 1000, version % 1000 / 10);
}

int main(void) {
  check_types();
  check_values();
  check_functions();
  if (getenv("ABI_CHECK_NO_DRIVER") == NULL)
    check_driver();
  printf("== %d checks, %d failed: %s\n", checks, failures,
         failures ? "driver.h does NOT match this CUDA" : "driver.h matches this CUDA");
  return failures ? 1 : 0;
}
