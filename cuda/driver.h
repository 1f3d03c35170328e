/*
 * driver.h - the few CUDA driver API types, constants and functions that
 * libsymmem uses, declared by hand so that the library builds with no CUDA
 * toolkit installed. The driver itself (libcuda.so.1) is loaded at run time
 * with dlopen; nothing here links against it.
 *
 * Every name carries a prefix (sm_ for types, SM_ for constants) so that this
 * header and the real <cuda.h> can be included together: abicheck/abi_check.c
 * does exactly that on a GPU machine and asserts that every size, field offset,
 * enum value and function signature below matches the real header.
 *
 * Values are from the CUDA Driver API reference (CUDA 12.x). Layouts assume an
 * LP64 Linux target (x86-64 or aarch64), the only targets the driver ships for.
 */
#ifndef SYMMEM_CUDA_DRIVER_H
#define SYMMEM_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

/* ---- scalar and opaque handle types ------------------------------------ */

typedef uint32_t sm_cuuint32_t;
typedef int sm_CUdevice;                       /* a device ordinal as the driver sees it */
typedef unsigned long long sm_CUdeviceptr;     /* a device (unified) virtual address */
typedef unsigned long long sm_CUmemGenericAllocationHandle;
/* The struct tags are the driver's own; they are only ever incomplete, so
 * sharing them with <cuda.h> (and with symmem.h's struct CUstream_st) is
 * harmless and keeps stream pointers the same type everywhere. */
typedef struct CUctx_st *sm_CUcontext;
typedef struct CUstream_st *sm_CUstream;
typedef struct CUevent_st *sm_CUevent;
typedef struct CUmod_st *sm_CUmodule;
typedef struct CUfunc_st *sm_CUfunction;

typedef struct sm_CUuuid_st {
  char bytes[16];
} sm_CUuuid;

/* ---- result codes (CUresult) -------------------------------------------- */

typedef enum sm_cudaError_enum {
  SM_CUDA_SUCCESS = 0,
  SM_CUDA_ERROR_INVALID_VALUE = 1,
  SM_CUDA_ERROR_OUT_OF_MEMORY = 2,
  SM_CUDA_ERROR_NOT_INITIALIZED = 3,
  SM_CUDA_ERROR_DEINITIALIZED = 4,
  SM_CUDA_ERROR_NO_DEVICE = 100,
  SM_CUDA_ERROR_INVALID_DEVICE = 101,
  SM_CUDA_ERROR_NOT_PERMITTED = 800,
  SM_CUDA_ERROR_NOT_SUPPORTED = 801
} sm_CUresult;

/* ---- device attributes (CUdevice_attribute) ----------------------------- */

typedef enum sm_CUdevice_attribute_enum {
  SM_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  SM_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
  SM_CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
  SM_CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
  SM_CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
  SM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  SM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  SM_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
  SM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
  SM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128, /* CUDA 12.3+ */
  SM_CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 132            /* CUDA 12.1+; queried only */
} sm_CUdevice_attribute;

/* ---- peer attributes (CUdevice_P2PAttribute), for the diagnostic -------- */
typedef enum sm_CUdevice_P2PAttribute_enum {
  SM_CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK = 1,
  SM_CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED = 2,
  SM_CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED = 3
} sm_CUdevice_P2PAttribute;

/* ---- virtual memory management ------------------------------------------ */

typedef enum sm_CUmemAllocationType_enum {
  SM_CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
  SM_CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
} sm_CUmemAllocationType;

/* A bit set: requestedHandleTypes may combine several. */
typedef enum sm_CUmemAllocationHandleType_enum {
  SM_CU_MEM_HANDLE_TYPE_NONE = 0x0,
  SM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
  SM_CU_MEM_HANDLE_TYPE_FABRIC = 0x8 /* CUDA 12.3+ */
} sm_CUmemAllocationHandleType;

typedef enum sm_CUmemLocationType_enum {
  SM_CU_MEM_LOCATION_TYPE_INVALID = 0x0,
  SM_CU_MEM_LOCATION_TYPE_DEVICE = 0x1
} sm_CUmemLocationType;

typedef enum sm_CUmemAccess_flags_enum {
  SM_CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
  SM_CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
  SM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
} sm_CUmemAccess_flags;

typedef enum sm_CUmemAllocationGranularity_flags_enum {
  SM_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
  SM_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
} sm_CUmemAllocationGranularity_flags;

typedef struct sm_CUmemLocation_st {
  sm_CUmemLocationType type;
  int id;
} sm_CUmemLocation;

/* 32 bytes: type@0 requestedHandleTypes@4 location@8 win32HandleMetaData@16
 * allocFlags@24. Every field we do not set must be zero. */
typedef struct sm_CUmemAllocationProp_st {
  sm_CUmemAllocationType type;
  sm_CUmemAllocationHandleType requestedHandleTypes;
  sm_CUmemLocation location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} sm_CUmemAllocationProp;

typedef struct sm_CUmemAccessDesc_st {
  sm_CUmemLocation location;
  sm_CUmemAccess_flags flags;
} sm_CUmemAccessDesc;

/* ---- streams and events ------------------------------------------------- */

typedef enum sm_CUstream_flags_enum {
  SM_CU_STREAM_DEFAULT = 0x0,
  SM_CU_STREAM_NON_BLOCKING = 0x1
} sm_CUstream_flags;

/* How a thread's calls interact with stream captures on other threads
 * (cuThreadExchangeStreamCaptureMode). */
typedef enum sm_CUstreamCaptureMode_enum {
  SM_CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  SM_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  SM_CU_STREAM_CAPTURE_MODE_RELAXED = 2
} sm_CUstreamCaptureMode;

typedef enum sm_CUevent_flags_enum {
  SM_CU_EVENT_DEFAULT = 0x0,
  SM_CU_EVENT_DISABLE_TIMING = 0x2
} sm_CUevent_flags;

typedef enum sm_CUstreamWaitValue_flags_enum {
  SM_CU_STREAM_WAIT_VALUE_GEQ = 0x0,
  SM_CU_STREAM_WAIT_VALUE_EQ = 0x1
} sm_CUstreamWaitValue_flags;

typedef enum sm_CUstreamWriteValue_flags_enum {
  SM_CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
} sm_CUstreamWriteValue_flags;

typedef enum sm_CUstreamBatchMemOpType_enum {
  SM_CU_STREAM_MEM_OP_WAIT_VALUE_32 = 1,
  SM_CU_STREAM_MEM_OP_WRITE_VALUE_32 = 2
} sm_CUstreamBatchMemOpType;

/* One operation of cuStreamBatchMemOp. Only the wait and write members are
 * declared; pad gives the union the driver's size (48 bytes). The field names
 * are cuda.h's, so that abi_check.c compares every offset. */
typedef union sm_CUstreamBatchMemOpParams_union {
  sm_CUstreamBatchMemOpType operation;
  struct {
    sm_CUstreamBatchMemOpType operation;
    sm_CUdeviceptr address;
    union {
      sm_cuuint32_t value;
      unsigned long long value64;
    };
    unsigned int flags;
    sm_CUdeviceptr alias;
  } waitValue;
  struct {
    sm_CUstreamBatchMemOpType operation;
    sm_CUdeviceptr address;
    union {
      sm_cuuint32_t value;
      unsigned long long value64;
    };
    unsigned int flags;
    sm_CUdeviceptr alias;
  } writeValue;
  unsigned long long pad[6];
} sm_CUstreamBatchMemOpParams;

/* cuLaunchKernelEx's configuration: only programmatic stream serialization
 * (programmatic dependent launch, sm_90 on) is used; value pads the union
 * to the driver's 64 bytes. The field names are cuda.h's, so that
 * abi_check.c compares every offset. */
typedef enum sm_CUlaunchAttributeID_enum {
  SM_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
} sm_CUlaunchAttributeID;

typedef union sm_CUlaunchAttributeValue_union {
  char pad[64];
  int programmaticStreamSerializationAllowed;
} sm_CUlaunchAttributeValue;

typedef struct sm_CUlaunchAttribute_st {
  sm_CUlaunchAttributeID id;
  char pad[8 - sizeof(sm_CUlaunchAttributeID)];
  sm_CUlaunchAttributeValue value;
} sm_CUlaunchAttribute;

typedef struct sm_CUlaunchConfig_st {
  unsigned int gridDimX;
  unsigned int gridDimY;
  unsigned int gridDimZ;
  unsigned int blockDimX;
  unsigned int blockDimY;
  unsigned int blockDimZ;
  unsigned int sharedMemBytes;
  sm_CUstream hStream;
  sm_CUlaunchAttribute *attrs;
  unsigned int numAttrs;
} sm_CUlaunchConfig;

/* cuMemHostAlloc flags: pinned memory usable from every context. */
#define SM_CU_MEMHOSTALLOC_PORTABLE 0x01

/* ---- the functions ------------------------------------------------------ */

/*
 * SM_CU_FUNCTIONS(X, T) lists every driver function libsymmem resolves, as
 *
 *     X(api, symbol, (parameters))
 *
 * api is the name the documentation and <cuda.h> use, symbol the versioned
 * name the driver exports and that cuda.h's "#define api symbol" maps it to
 * (e.g. cuMemGetInfo -> cuMemGetInfo_v2), and every parameter type that has
 * a prefixed twin is written T(Name). Every function returns CUresult.
 *
 * The type mapper T is a parameter so that the same list yields our table of
 * function pointers (T prefixes: sm_CUdevice) and, in abi_check.c, the real
 * signatures (T is the identity: CUdevice) that are compared with the
 * declarations in <cuda.h>.
 *
 * Two symbols have an older fallback that the loader tries when the versioned
 * one is missing (drivers before 11.4 / 11.7): cuDeviceGetUuid_v2 ->
 * cuDeviceGetUuid, cuStreamWriteValue32_v2 / cuStreamWaitValue32_v2 -> the
 * unversioned names. Their signatures are identical.
 *
 * No multicast-object function may ever be listed here (project rule,
 * enforced by TestNoMulticastCalls); only the attribute above is queried.
 */
#define SM_CU_FUNCTIONS(X, T)                                                          \
  X(cuGetErrorName, cuGetErrorName, (T(CUresult) error, const char **pStr))            \
  X(cuGetErrorString, cuGetErrorString, (T(CUresult) error, const char **pStr))        \
  X(cuInit, cuInit, (unsigned int Flags))                                              \
  X(cuDriverGetVersion, cuDriverGetVersion, (int *driverVersion))                      \
  X(cuDeviceGet, cuDeviceGet, (T(CUdevice) *device, int ordinal))                      \
  X(cuDeviceGetCount, cuDeviceGetCount, (int *count))                                  \
  X(cuDeviceGetName, cuDeviceGetName, (char *name, int len, T(CUdevice) dev))          \
  X(cuDeviceGetUuid_v2, cuDeviceGetUuid_v2, (T(CUuuid) *uuid, T(CUdevice) dev))        \
  X(cuDeviceGetAttribute, cuDeviceGetAttribute,                                        \
    (int *pi, T(CUdevice_attribute) attrib, T(CUdevice) dev))                          \
  X(cuDeviceCanAccessPeer, cuDeviceCanAccessPeer,                                      \
    (int *canAccessPeer, T(CUdevice) dev, T(CUdevice) peerDev))                        \
  X(cuDeviceGetP2PAttribute, cuDeviceGetP2PAttribute,                                  \
    (int *value, T(CUdevice_P2PAttribute) attrib, T(CUdevice) srcDevice,               \
     T(CUdevice) dstDevice))                                                           \
  X(cuDeviceTotalMem, cuDeviceTotalMem_v2, (size_t *bytes, T(CUdevice) dev))            \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain,                                \
    (T(CUcontext) *pctx, T(CUdevice) dev))                                             \
  X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, (T(CUdevice) dev))        \
  X(cuCtxGetCurrent, cuCtxGetCurrent, (T(CUcontext) *pctx))                            \
  X(cuCtxSetCurrent, cuCtxSetCurrent, (T(CUcontext) ctx))                              \
  X(cuCtxSynchronize, cuCtxSynchronize, (void))                                        \
  X(cuMemGetInfo, cuMemGetInfo_v2, (size_t *freeBytes, size_t *totalBytes))            \
  X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity,                      \
    (size_t *granularity, const T(CUmemAllocationProp) *prop,                          \
     T(CUmemAllocationGranularity_flags) option))                                      \
  X(cuMemCreate, cuMemCreate,                                                          \
    (T(CUmemGenericAllocationHandle) *handle, size_t size,                             \
     const T(CUmemAllocationProp) *prop, unsigned long long flags))                    \
  X(cuMemRelease, cuMemRelease, (T(CUmemGenericAllocationHandle) handle))              \
  X(cuMemAddressReserve, cuMemAddressReserve,                                          \
    (T(CUdeviceptr) *ptr, size_t size, size_t alignment, T(CUdeviceptr) addr,          \
     unsigned long long flags))                                                        \
  X(cuMemAddressFree, cuMemAddressFree, (T(CUdeviceptr) ptr, size_t size))             \
  X(cuMemMap, cuMemMap,                                                                \
    (T(CUdeviceptr) ptr, size_t size, size_t offset,                                   \
     T(CUmemGenericAllocationHandle) handle, unsigned long long flags))                \
  X(cuMemUnmap, cuMemUnmap, (T(CUdeviceptr) ptr, size_t size))                         \
  X(cuMemSetAccess, cuMemSetAccess,                                                    \
    (T(CUdeviceptr) ptr, size_t size, const T(CUmemAccessDesc) *desc, size_t count))   \
  X(cuMemGetAccess, cuMemGetAccess,                                                    \
    (unsigned long long *flags, const T(CUmemLocation) *location, T(CUdeviceptr) ptr)) \
  X(cuMemExportToShareableHandle, cuMemExportToShareableHandle,                        \
    (void *shareableHandle, T(CUmemGenericAllocationHandle) handle,                    \
     T(CUmemAllocationHandleType) handleType, unsigned long long flags))               \
  X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle,                    \
    (T(CUmemGenericAllocationHandle) *handle, void *osHandle,                          \
     T(CUmemAllocationHandleType) shHandleType))                                       \
  X(cuStreamCreate, cuStreamCreate, (T(CUstream) *phStream, unsigned int Flags))       \
  X(cuStreamDestroy, cuStreamDestroy_v2, (T(CUstream) hStream))                        \
  X(cuStreamSynchronize, cuStreamSynchronize, (T(CUstream) hStream))                   \
  X(cuStreamWaitEvent, cuStreamWaitEvent,                                              \
    (T(CUstream) hStream, T(CUevent) hEvent, unsigned int Flags))                      \
  X(cuEventCreate, cuEventCreate, (T(CUevent) *phEvent, unsigned int Flags))           \
  X(cuEventRecord, cuEventRecord, (T(CUevent) hEvent, T(CUstream) hStream))            \
  X(cuEventDestroy, cuEventDestroy_v2, (T(CUevent) hEvent))                            \
  X(cuMemsetD8Async, cuMemsetD8Async,                                                  \
    (T(CUdeviceptr) dstDevice, unsigned char uc, size_t N, T(CUstream) hStream))       \
  X(cuMemcpyAsync, cuMemcpyAsync,                                                      \
    (T(CUdeviceptr) dst, T(CUdeviceptr) src, size_t ByteCount, T(CUstream) hStream))   \
  X(cuMemHostAlloc, cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags))  \
  X(cuMemFreeHost, cuMemFreeHost, (void *p))                                           \
  X(cuThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode,              \
    (T(CUstreamCaptureMode) *mode))                                                    \
  X(cuStreamWriteValue32, cuStreamWriteValue32_v2,                                     \
    (T(CUstream) stream, T(CUdeviceptr) addr, T(cuuint32_t) value, unsigned int flags)) \
  X(cuStreamWaitValue32, cuStreamWaitValue32_v2,                                       \
    (T(CUstream) stream, T(CUdeviceptr) addr, T(cuuint32_t) value, unsigned int flags)) \
  X(cuStreamBatchMemOp, cuStreamBatchMemOp_v2,                                         \
    (T(CUstream) stream, unsigned int count, T(CUstreamBatchMemOpParams) *paramArray,  \
     unsigned int flags))                                                              \
  X(cuModuleLoadData, cuModuleLoadData, (T(CUmodule) *module, const void *image))      \
  X(cuModuleUnload, cuModuleUnload, (T(CUmodule) hmod))                                \
  X(cuModuleGetFunction, cuModuleGetFunction,                                          \
    (T(CUfunction) *hfunc, T(CUmodule) hmod, const char *name))                        \
  X(cuLaunchKernel, cuLaunchKernel,                                                    \
    (T(CUfunction) f, unsigned int gridDimX, unsigned int gridDimY,                    \
     unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,            \
     unsigned int blockDimZ, unsigned int sharedMemBytes, T(CUstream) hStream,         \
     void **kernelParams, void **extra))

/* Functions that newer drivers have and older ones lack; resolved as
 * optional (left NULL when missing) and kept out of the ABI check, which
 * compiles against whatever cuda.h the GPU machine has. The fabric cluster
 * and clique of a device (CUDA 13): which GPUs share one NVLink domain, so
 * that ranks on different machines in it can map each other through fabric
 * handles (Note [Fabric teams] in core/symm). cuLaunchKernelEx (CUDA 11.8):
 * the collectives' launch with programmatic dependent launch.
 * cuStreamIsCapturing (CUDA 10; captureStatus a CUstreamCaptureStatus, 0
 * none, 1 active, 2 invalidated): whether a copy-engine collective is
 * being captured, whose watchdog then stays off (core/symm/coll, Note
 * [Copy-engine collectives]). */
typedef struct sm_CUcliqueInfo_st {
  int type; /* CUcliqueType: 0 = CU_CLIQUE_TYPE_UNICAST_POINTER */
  unsigned int id;
} sm_CUcliqueInfo;

#define SM_CU_OPTIONAL_FUNCTIONS(X, T)                                                 \
  X(cuDeviceGetFabricClusterUuid, cuDeviceGetFabricClusterUuid,                        \
    (T(CUuuid) *uuid, T(CUdevice) dev))                                                \
  X(cuDeviceGetCliqueInfo, cuDeviceGetCliqueInfo,                                      \
    (T(CUcliqueInfo) *cliqueInfo, size_t *count, T(CUdevice) dev))                     \
  X(cuLaunchKernelEx, cuLaunchKernelEx,                                                \
    (const T(CUlaunchConfig) *config, T(CUfunction) f, void **kernelParams,            \
     void **extra))                                                                    \
  X(cuStreamIsCapturing, cuStreamIsCapturing,                                          \
    (T(CUstream) hStream, int *captureStatus))

/* The type mapper for our own declarations: T(CUdevice) -> sm_CUdevice. */
#define SM_CU_PREFIXED(name) sm_##name

#endif /* SYMMEM_CUDA_DRIVER_H */
