/* Two trivial pluggable allocators for PyTorch's CUDAPluggableAllocator,
 * the floors that bench/torch_alloc_bench.py compares libsymmem against:
 *
 *   raw_alloc / raw_free      pass-through: the driver's cuMemAlloc and
 *                             cuMemFree on every call (what cudaMalloc and
 *                             cudaFree do underneath)
 *   cache_alloc / cache_free  a size-keyed free list under one mutex that
 *                             never returns memory: the floor of PyTorch's
 *                             pluggable path (two C calls per tensor)
 *
 * Built by the benchmark itself with the C compiler, no CUDA toolkit:
 *
 *   cc -O2 -shared -fPIC -o build/bench/trivial_alloc.so bench/trivial_alloc.c -ldl -lpthread
 *
 * libcuda.so.1 is opened at the first allocation (the driver PyTorch runs
 * on). The calls run in the calling thread's current context; a thread with
 * none gets the device's primary context, which is the one PyTorch's
 * runtime uses. A failure prints the driver's code and returns NULL. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static CUresult (*p_cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*p_cuMemFree)(CUdeviceptr);
static CUresult (*p_cuCtxGetCurrent)(CUcontext *);
static CUresult (*p_cuCtxSetCurrent)(CUcontext);
static CUresult (*p_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded;

static void load(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "trivial_alloc: cannot open libcuda.so.1: %s\n", dlerror());
    return;
  }
  p_cuMemAlloc = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
  p_cuMemFree = (CUresult(*)(CUdeviceptr))dlsym(h, "cuMemFree_v2");
  p_cuCtxGetCurrent = (CUresult(*)(CUcontext *))dlsym(h, "cuCtxGetCurrent");
  p_cuCtxSetCurrent = (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
  p_cuDevicePrimaryCtxRetain = (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain_v2");
  if (p_cuDevicePrimaryCtxRetain == NULL)
    p_cuDevicePrimaryCtxRetain = (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
  p_cuDeviceGet = (CUresult(*)(CUdevice *, int))dlsym(h, "cuDeviceGet");
  loaded = p_cuMemAlloc && p_cuMemFree && p_cuCtxGetCurrent && p_cuCtxSetCurrent &&
           p_cuDevicePrimaryCtxRetain && p_cuDeviceGet;
  if (!loaded)
    fprintf(stderr, "trivial_alloc: libcuda.so.1 lacks cuMemAlloc_v2, cuMemFree_v2 or a context call\n");
}

/* A current context for device on this thread (its primary context when
 * the thread has none). */
static int ready(int device) {
  pthread_once(&load_once, load);
  if (!loaded)
    return 0;
  CUcontext ctx = NULL;
  if (p_cuCtxGetCurrent(&ctx) == 0 && ctx != NULL)
    return 1;
  CUdevice dev;
  CUresult r = p_cuDeviceGet(&dev, device);
  if (r == 0)
    r = p_cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == 0)
    r = p_cuCtxSetCurrent(ctx);
  if (r != 0)
    fprintf(stderr, "trivial_alloc: no context for device %d (CUresult %d)\n", device, r);
  return r == 0;
}

void *raw_alloc(size_t size, int device, void *stream) {
  (void)stream;
  CUdeviceptr p = 0;
  if (!ready(device))
    return NULL;
  CUresult r = p_cuMemAlloc(&p, size ? size : 1);
  if (r != 0) {
    fprintf(stderr, "trivial_alloc: cuMemAlloc(%zu) failed (CUresult %d)\n", size, r);
    return NULL;
  }
  return (void *)(uintptr_t)p;
}

void raw_free(void *ptr, size_t size, int device, void *stream) {
  (void)size, (void)stream;
  if (ptr != NULL && ready(device))
    p_cuMemFree((CUdeviceptr)(uintptr_t)ptr);
}

/* The free list: one singly linked list per exact size, in a small open
 * hash table; blocks are never given back to the driver. */
struct node {
  void *ptr;
  size_t size;
  struct node *next;
};
#define BUCKETS 4096
static struct node *free_by_size[BUCKETS];
static struct node *spare_nodes;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static size_t bucket(size_t size) { return (size * 0x9E3779B97F4A7C15ull) >> 52; }

void *cache_alloc(size_t size, int device, void *stream) {
  pthread_mutex_lock(&mu);
  struct node **pp = &free_by_size[bucket(size) % BUCKETS];
  for (; *pp != NULL; pp = &(*pp)->next) {
    if ((*pp)->size == size) {
      struct node *n = *pp;
      *pp = n->next;
      void *p = n->ptr;
      n->next = spare_nodes;
      spare_nodes = n;
      pthread_mutex_unlock(&mu);
      return p;
    }
  }
  pthread_mutex_unlock(&mu);
  return raw_alloc(size, device, stream);
}

void cache_free(void *ptr, size_t size, int device, void *stream) {
  (void)device, (void)stream;
  if (ptr == NULL)
    return;
  pthread_mutex_lock(&mu);
  struct node *n = spare_nodes;
  if (n != NULL)
    spare_nodes = n->next;
  else
    n = malloc(sizeof *n);
  if (n == NULL) { /* out of host memory: keep the block unreachable */
    pthread_mutex_unlock(&mu);
    return;
  }
  n->ptr = ptr;
  n->size = size;
  struct node **head = &free_by_size[bucket(size) % BUCKETS];
  n->next = *head;
  *head = n;
  pthread_mutex_unlock(&mu);
}
