// stream_signal_bench.cu - GPU time of a two-rank barrier done with stream
// memory operations, protocol by protocol (the measurements behind Note
// [Signals] in core/symm/signal.go).
//
// One process, two GPUs with peer access, one non-blocking stream each; a
// "rank" is a GPU. Each variant runs 2000 barriers in a row on both streams
// (enqueued from one host thread, then both streams synchronised) and prints
// per_barrier_us (wall time / barriers: GPU-bound when it exceeds the host
// time), enqueue_us (host time per rank per barrier) and isolated_us (one
// barrier enqueued and waited for, averaged over 100).
//
//   nvcc -O2 -arch=sm_90 -o /tmp/ssb bench/stream_signal_bench.cu -lcuda && /tmp/ssb
//
// Variants: the 0/1 protocol libsymmem used first (wait for the peer's slot
// to be clear, set it, wait for ours, clear it: 4 operations, one of them a
// remote poll); the count protocol it uses now (write the next count into the
// peer's slot, wait until ours has reached it) as one batch, as two single
// calls, as two batches; two batches where the first holds two writes; a
// one-thread kernel doing the same with st/ld.acquire at system scope; and an
// empty kernel (the launch floor).
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <chrono>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)
#define CKD(x) do { CUresult e = (x); if (e) { const char* s; cuGetErrorName(e, &s); printf("%s:%d %s\n", __FILE__, __LINE__, s); exit(1); } } while (0)

__global__ void kbar(unsigned* peer_slot, unsigned* my_slot, unsigned seq) {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" :: "l"(peer_slot), "r"(seq) : "memory");
  unsigned v;
  do { asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(my_slot) : "memory"); } while ((int)(v - seq) < 0);
}

static unsigned* pad[2];
static cudaStream_t st[2];

static void wr(CUstreamBatchMemOpParams* p, unsigned* a, unsigned v, unsigned flags) {
  memset(p, 0, sizeof *p); p->writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  p->writeValue.address = (CUdeviceptr)a; p->writeValue.value = v; p->writeValue.flags = flags;
}
static void wt(CUstreamBatchMemOpParams* p, unsigned* a, unsigned v, unsigned flags) {
  memset(p, 0, sizeof *p); p->waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  p->waitValue.address = (CUdeviceptr)a; p->waitValue.value = v; p->waitValue.flags = flags;
}

// slot of sender s in receiver r's pad: pad[r] + s
static void one(int v, int r, unsigned seq) {
  int p = 1 - r;
  CUstreamBatchMemOpParams ops[4];
  cudaSetDevice(r);
  switch (v) {
  case 0: // current: wait peer slot 0, write 1; wait mine 1, write 0
    wt(&ops[0], pad[p] + r, 0, CU_STREAM_WAIT_VALUE_EQ); wr(&ops[1], pad[p] + r, 1, 0);
    wt(&ops[2], pad[r] + p, 1, CU_STREAM_WAIT_VALUE_EQ); wr(&ops[3], pad[r] + p, 0, 0);
    CKD(cuStreamBatchMemOp((CUstream)st[r], 4, ops, 0)); break;
  case 1: // counter: write seq, wait GEQ seq
    wr(&ops[0], pad[p] + r, seq, 0); wt(&ops[1], pad[r] + p, seq, CU_STREAM_WAIT_VALUE_GEQ);
    CKD(cuStreamBatchMemOp((CUstream)st[r], 2, ops, 0)); break;
  case 2: // counter, separate calls
    CKD(cuStreamWriteValue32((CUstream)st[r], (CUdeviceptr)(pad[p] + r), seq, 0));
    CKD(cuStreamWaitValue32((CUstream)st[r], (CUdeviceptr)(pad[r] + p), seq, CU_STREAM_WAIT_VALUE_GEQ)); break;
  case 3: // counter, wait with FLUSH
    wr(&ops[0], pad[p] + r, seq, 0); wt(&ops[1], pad[r] + p, seq, CU_STREAM_WAIT_VALUE_GEQ | CU_STREAM_WAIT_VALUE_FLUSH);
    CKD(cuStreamBatchMemOp((CUstream)st[r], 2, ops, 0)); break;
  case 4: // kernel
    kbar<<<1, 1, 0, st[r]>>>(pad[p] + r, pad[r] + p, seq); break;
  case 6: // counter: two batches (writes, then waits)
    wr(&ops[0], pad[p] + r, seq, 0); wt(&ops[1], pad[r] + p, seq, CU_STREAM_WAIT_VALUE_GEQ);
    CKD(cuStreamBatchMemOp((CUstream)st[r], 1, &ops[0], 0));
    CKD(cuStreamBatchMemOp((CUstream)st[r], 1, &ops[1], 0)); break;
  case 7: // counter: batch [write, write(dummy local)], batch [wait]
    wr(&ops[0], pad[p] + r, seq, 0); wr(&ops[1], pad[r] + 16, seq, 0); wt(&ops[2], pad[r] + p, seq, CU_STREAM_WAIT_VALUE_GEQ);
    CKD(cuStreamBatchMemOp((CUstream)st[r], 2, &ops[0], 0));
    CKD(cuStreamBatchMemOp((CUstream)st[r], 1, &ops[2], 0)); break;
  case 5: // no-op kernel (launch floor)
    kbar<<<1, 1, 0, st[r]>>>(pad[r] + 8, pad[r] + 9, 0); break;
  }
}

int main() {
  const char* names[] = {"clear(4 ops: wait0,write1,wait1,write0)", "counter(write,waitGEQ) batch", "counter separate calls", "counter waitGEQ|FLUSH", "kernel st.sys/ld.acquire", "empty kernel", "counter two batches", "counter batch[2 writes]+batch[wait]"};
  for (int r = 0; r < 2; r++) {
    CK(cudaSetDevice(r)); CK(cudaDeviceEnablePeerAccess(1 - r, 0));
    CK(cudaMalloc(&pad[r], 4096)); CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
  }
  for (int rep = 0; rep < 3; rep++)
  for (int v = 0; v < 8; v++) {
    if (v == 3) continue;  // CU_STREAM_WAIT_VALUE_FLUSH: not supported on the H200s
    for (int r = 0; r < 2; r++) { cudaSetDevice(r); CK(cudaMemset(pad[r], 0, 4096)); CK(cudaDeviceSynchronize()); }
    unsigned seq = 0;
    for (int i = 0; i < 50; i++) { seq++; one(v, 0, seq); one(v, 1, seq); }
    for (int r = 0; r < 2; r++) CK(cudaStreamSynchronize(st[r]));
    const int n = 2000;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; i++) { seq++; one(v, 0, seq); one(v, 1, seq); }
    auto t1 = std::chrono::steady_clock::now();
    for (int r = 0; r < 2; r++) CK(cudaStreamSynchronize(st[r]));
    auto t2 = std::chrono::steady_clock::now();
    // latency of one isolated barrier
    double iso = 0;
    for (int i = 0; i < 100; i++) {
      auto a = std::chrono::steady_clock::now();
      seq++; one(v, 0, seq); one(v, 1, seq);
      for (int r = 0; r < 2; r++) CK(cudaStreamSynchronize(st[r]));
      iso += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    }
    printf("{\"variant\": \"%s\", \"per_barrier_us\": %.2f, \"enqueue_us\": %.2f, \"isolated_us\": %.2f}\n", names[v],
           std::chrono::duration<double, std::micro>(t2 - t0).count() / n,
           std::chrono::duration<double, std::micro>(t1 - t0).count() / n / 2, iso / 100);
  }
  return 0;
}
