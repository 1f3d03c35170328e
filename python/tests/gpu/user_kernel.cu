// A user's kernel on libsymmem's device header, built with nvcc by
// test_coll_gpu.py: it includes symmem_device.cuh (no link against the
// library for the device part) and uses symmem.h on the host.
//
// usage: user_kernel RANK WORLD DEVICE NAME
// Every rank fills its block with rank*100000 + i (n ints), then 50 times:
// a grid barrier across ranks, a copy of the next rank's ints into our
// block at n, a copy of ours into the next rank's block at 2n, a grid
// barrier; a thread signals the next rank and waits for the previous one
// on a user set. The host then checks both copies and prints RESULT ok.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <symmem.h>
#include <symmem_device.cuh>

__global__ void ring(symmem_device_view v, unsigned long long n, int *failed) {
  unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
  int next = (v.rank + 1) % v.world, prev = (v.rank + v.world - 1) % v.world;
  if (!symmem_dev_barrier_grid(v, 0)) {
    *failed = 1;
    return;
  }
  symmem_dev_copy(symmem_dev_ptr(v, v.rank, 4 * n), symmem_dev_ptr(v, next, 0), 4 * n, tid, nthreads);
  symmem_dev_copy(symmem_dev_ptr(v, next, 8 * n), symmem_dev_ptr(v, v.rank, 0), 4 * n, tid, nthreads);
  if (!symmem_dev_barrier_grid(v, 0)) {
    *failed = 2;
    return;
  }
  if (tid == 0) {
    symmem_dev_signal(v, next, SYMMEM_DEV_LIBRARY_SETS + 5);
    if (!symmem_dev_wait(v, prev, SYMMEM_DEV_LIBRARY_SETS + 5))
      *failed = 3;
  }
}

#define CHECK(x)                                                                            \
  do {                                                                                      \
    if (!(x)) {                                                                             \
      fprintf(stderr, "FAILED %s at line %d: %s\n", #x, __LINE__, symmem_last_error_message()); \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 5)
    return 2;
  int rank = atoi(argv[1]), world = atoi(argv[2]), device = atoi(argv[3]);
  const unsigned long long n = 100003;
  CHECK(cudaSetDevice(device) == cudaSuccess);
  symmem_group *g = NULL;
  CHECK(symmem_group_create(argv[4], rank, world, device, 60000, &g) == SYMMEM_SUCCESS);
  int *buf = (int *)symmem_alloc(12 * n, device, NULL);
  CHECK(buf != NULL);
  int *host = (int *)malloc(12 * n);
  for (unsigned long long i = 0; i < 3 * n; i++)
    host[i] = i < n ? rank * 100000 + (int)i : -1;
  CHECK(cudaMemcpy(buf, host, 12 * n, cudaMemcpyHostToDevice) == cudaSuccess);
  symmem_handle *h = NULL;
  CHECK(symmem_rendezvous(buf, g, &h) == SYMMEM_SUCCESS);
  symmem_device_view v;
  symmem_dev_view_init_host(&v, symmem_handle_buffer_ptrs_dev(h), symmem_handle_signal_pad_ptrs_dev(h),
                            symmem_handle_signal_pad_size(h), rank, world, 0);
  int *failed = NULL;
  CHECK(cudaMalloc(&failed, sizeof(int)) == cudaSuccess);
  CHECK(cudaMemset(failed, 0, sizeof(int)) == cudaSuccess);
  for (int it = 0; it < 50; it++)
    ring<<<8, 256>>>(v, n, failed);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  int f = -1;
  CHECK(cudaMemcpy(&f, failed, sizeof f, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(f == 0);
  // Everyone has finished writing into our block before we read it.
  CHECK(symmem_barrier(h, 0, 60000, NULL) == SYMMEM_SUCCESS);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cudaMemcpy(host, buf, 12 * n, cudaMemcpyDeviceToHost) == cudaSuccess);
  int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  for (unsigned long long i = 0; i < n; i++) {
    CHECK(host[n + i] == next * 100000 + (int)i);
    CHECK(host[2 * n + i] == prev * 100000 + (int)i);
  }
  uint32_t flag = 1;
  CHECK(symmem_handle_device_error(h, &flag) == SYMMEM_SUCCESS && flag == 0);
  CHECK(symmem_handle_release(h) == SYMMEM_SUCCESS);
  symmem_free(buf, 12 * n, device, NULL);
  CHECK(symmem_group_destroy(g) == SYMMEM_SUCCESS);
  printf("RESULT ok\n");
  return 0;
}
