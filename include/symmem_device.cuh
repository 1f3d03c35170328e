/*
 * symmem_device.cuh - libsymmem's device-side contract: what a CUDA kernel
 * needs to work on symmetric memory from a symmem_handle (include/symmem.h).
 *
 * Header-only CUDA C++. It compiles with nvcc and with NVRTC, and includes
 * nothing (no CUDA headers, no standard headers), so an NVRTC program needs
 * only this file; nothing links against libsymmem. The library's own
 * collectives are built on it (compiled at run time with NVRTC).
 *
 * Requirements: sm_70 or newer (ld.acquire / red.release at system scope);
 * 64-bit device code. Every function is __device__ and __forceinline__.
 *
 * ---------------------------------------------------------------------------
 * The view of a handle
 *
 * A kernel gets a symmem_device_view by value, filled on the host from the
 * handle (symmem_dev_view_init_host below, or by hand):
 *
 *   buffers  symmem_handle_buffer_ptrs_dev(h): world pointers to every rank's
 *            block (start of the block, not the rendezvous pointer)
 *   pads     symmem_handle_signal_pad_ptrs_dev(h): world pointers to every
 *            rank's signal pad
 *   pad_size symmem_handle_signal_pad_size(h)
 *   rank, world, timeout_ns (0: SYMMEM_DEV_DEFAULT_TIMEOUT_NS)
 *
 * These are the same arrays torch's SymmetricMemory exposes as
 * buffer_ptrs_dev / signal_pad_ptrs_dev, so kernels written for torch's
 * handles (Triton ones included) run on libsymmem's unchanged as long as
 * they keep to the users' part of the pad (next section).
 *
 * ---------------------------------------------------------------------------
 * The pad partition (never collide)
 *
 * Each rank's signal pad is two parts:
 *
 *   [0, pad_size)   users' part: 32-bit slots channel*world + sender, the
 *                   counts of the host-side signals (symmem_put_signal,
 *                   symmem_wait_signal, symmem_barrier) and whatever users'
 *                   own kernels do with the channels they pick. The library
 *                   never touches a slot of this part except on the host
 *                   signal calls, on the channel passed to them.
 *   [pad_size, pad_size + SYMMEM_DEV_REGION_BYTES(world))
 *                   the device region: the barriers of this header and the
 *                   library's collectives. No channel reaches it (the pad's
 *                   memory is made larger than pad_size). Zeroed with the pad.
 *
 * The device region, in 32-bit words:
 *
 *   word 0          the error flag: 0, or the first failure:
 *                   0x80000000 | cause << 29 | peer << 16 | set
 *                   (symmem_handle_device_error reads it on the host), cause
 *                   SYMMEM_DEV_CAUSE_TIMEOUT (a wait for peer gave up),
 *                   SYMMEM_DEV_CAUSE_MISMATCH (peer called a collective with
 *                   other arguments), SYMMEM_DEV_CAUSE_PEER_EXITED (peer's
 *                   process exited while we waited) or, with
 *                   SYMMEM_DEV_OVERRUN_SET_BIT in the set field, cause 3
 *                   (an all-to-all's splits from peer overran a buffer;
 *                   nothing was written to out)
 *   word 1          the abort word: 0, or 0x80000000 |
 *                   SYMMEM_DEV_CAUSE_PEER_EXITED << 29 | peer << 16, written
 *                   by the library on the host when it sees rank peer's
 *                   process exit
 *   word 2          the library's: the buffer of the all-reduce that is a
 *                   barrier across machines (its value means nothing)
 *   word 3          the stop word: 0, or why the group's collectives
 *                   stopped (core/symm/coll/coll.go, Note [Failed
 *                   collectives]): the error flag of a collective's wait of
 *                   this rank that gave up, or 0x80000000 |
 *                   SYMMEM_DEV_CAUSE_GAVE_UP << 29 | r << 16 | cause << 12 |
 *                   set, written by rank r when a wait of its own
 *                   collective gave up for cause at set. Once it is set,
 *                   the library's collectives on the group refuse to run
 *                   (their kernels return at once, host-side calls fail);
 *                   the waits of this header do not read it (a wait's
 *                   flag keeps naming its own cause)
 *   words 4, 5      the library's: the low-latency collectives' call count
 *                   and how many blocks of the current call have finished
 *   words 6, 7      the library's: the same for the all-to-alls
 *   words 8..15     reserved
 *   set s           2*world words at SYMMEM_DEV_HEADER_WORDS + s*2*world, for
 *                   s in [0, SYMMEM_DEV_SETS):
 *                     arrivals[w] (word w): how many times rank w arrived at
 *                       this set's barrier (only rank w adds, atomically, with
 *                       release at system scope)
 *                     seen[w] (word world + w): how many of rank w's arrivals
 *                       this rank has consumed (only this rank writes);
 *                       seen[rank] is the set's grid-barrier counter.
 *
 * After the sets, at the first 8-byte aligned address
 * (symmem_dev_arg_slot), the argument slots of the library's sets: for set
 * s < SYMMEM_DEV_LIBRARY_SETS and sender w, 16 bytes at 16 * (s*world + w):
 * the 64-bit word arrival << 32 | digest that rank w's collective published
 * with its arrival at s's opening barrier, in the first word for an even
 * arrival and the second for an odd one (the host backend, which runs no
 * kernels, keeps the packed arguments in the second; core/symm/coll/coll.go,
 * Note [Collective agreement]).
 *
 * Where the library runs kernels, the pad's memory holds after the device
 * region (at its end rounded up to 256 bytes) the library's low-latency
 * buffers (Note [Low-latency collectives]); no user set or channel
 * reaches them.
 *
 * Sets [0, SYMMEM_DEV_LIBRARY_SETS) belong to the library's collectives:
 * collective channel c, kernel block b uses set c*SYMMEM_DEV_COLL_MAX_BLOCKS +
 * b. Users' barriers take a user set u in [0, SYMMEM_DEV_USER_SETS), which is
 * set SYMMEM_DEV_LIBRARY_SETS + u. Kernels that may run at the same time
 * (different streams) must use different sets; one kernel may use a set any
 * number of times.
 *
 * ---------------------------------------------------------------------------
 * The counting protocol (barriers need no reset)
 *
 * A barrier on set s: every participating thread that stands for a peer p
 * adds 1 to arrivals[me] in p's region (red.release.sys), then waits until
 * arrivals[p] in its own region has reached seen[p] + 1 (ld.acquire.sys,
 * compared as (int)(count - expected) >= 0 so that wrap-around at 2^32 is
 * harmless) and stores seen[p] + 1. Counts only grow and every barrier is
 * balanced, so the pads are ready for the next barrier, the next kernel and
 * the next replay of a CUDA graph with no host reset. This is the same rule
 * as the host-side signals (Note [Signals]: a slot is a count, only its
 * sender raises it), with the receiver's count kept in the region.
 *
 * Memory order: writes made before a barrier by any thread of the block (or,
 * for the grid barrier, of the grid) are visible after it to every thread of
 * the peers' matching blocks (release at system scope after __syncthreads;
 * acquire at system scope before __syncthreads).
 *
 * ---------------------------------------------------------------------------
 * Bounded waits
 *
 * No wait of this header spins forever. A wait gives up after the view's
 * timeout_ns of %globaltimer time (SYMMEM_DEV_DEFAULT_TIMEOUT_NS, 10 s, when
 * 0; the library's collectives pass the group's timeout, SYMMEM_TIMEOUT_MS,
 * default 300 s), records 0x80000000 | peer << 16 | set in word 0 of its own
 * device region (the first failure only, atomicCAS from 0) and returns false;
 * the barrier then returns false in every thread of the block, and the
 * caller should return (its results are undefined; the group's counts are no
 * longer balanced: use another group). A wait also gives up at once, without
 * waiting for the timeout, when the abort word is set (a peer's process
 * exited: the flag then records SYMMEM_DEV_CAUSE_PEER_EXITED) or when the
 * flag already records a mismatch (another block of this rank found that a
 * peer called a collective with other arguments). It never traps, so the context and
 * other work on the GPU survive. Define SYMMEM_DEV_TRAP_ON_TIMEOUT before
 * including this header to trap instead.
 */
#ifndef SYMMEM_DEVICE_CUH
#define SYMMEM_DEVICE_CUH

/* ---- layout constants (core/pad.go, Note [Pad partition]) ------------- */

#define SYMMEM_DEV_HEADER_WORDS 16
#define SYMMEM_DEV_SETS 512
#define SYMMEM_DEV_COLL_CHANNELS 4
#define SYMMEM_DEV_COLL_MAX_BLOCKS 64
#define SYMMEM_DEV_LIBRARY_SETS 256
#define SYMMEM_DEV_USER_SETS (SYMMEM_DEV_SETS - SYMMEM_DEV_LIBRARY_SETS)
/* Bytes of the device region for world ranks: the words, up to 4 bytes of
 * alignment, the argument slots. */
#define SYMMEM_DEV_REGION_BYTES(world)                                                        \
  (4ull * (SYMMEM_DEV_HEADER_WORDS + SYMMEM_DEV_SETS * 2ull * (world)) + 8ull +               \
   16ull * SYMMEM_DEV_LIBRARY_SETS * (world))
#define SYMMEM_DEV_DEFAULT_TIMEOUT_NS 10000000000ull
/* Causes of the error flag (word 0), in bits 29..30. */
#define SYMMEM_DEV_CAUSE_TIMEOUT 0
#define SYMMEM_DEV_CAUSE_MISMATCH 1
#define SYMMEM_DEV_CAUSE_PEER_EXITED 2
/* The cause of a stop word (word SYMMEM_DEV_STOP_WORD) that a peer wrote:
 * the peer gave up a wait of its collective. */
#define SYMMEM_DEV_CAUSE_GAVE_UP 3
#define SYMMEM_DEV_STOP_WORD 3
/* An all-to-all's refusal in the error flag: cause 3 with this bit in the
 * set field (core/symm/coll/alltoall.go, Note [All-to-all]); the peer field
 * names the rank whose splits were bad, or the receiver whose out they
 * would pass. */
#define SYMMEM_DEV_OVERRUN_SET_BIT 0x8000u

/* The view of a handle, passed to kernels by value (40 bytes; the
 * library's collectives pass the same layout). */
struct symmem_device_view {
  void *const *buffers;          /* world block pointers (device array) */
  unsigned int *const *pads;     /* world signal pad pointers (device array) */
  unsigned long long pad_size;   /* bytes of the users' part of each pad */
  unsigned long long timeout_ns; /* bound of every wait; 0: the default */
  int rank;
  int world;
};

#ifdef __CUDACC__

/* ---- memory operations at system scope ---------------------------------- */

/* Loads a 32-bit word with acquire semantics at system scope: later loads
 * and stores of this thread are ordered after it, and see what the writer
 * made visible before its release. */
static __device__ __forceinline__ unsigned int symmem_dev_ld_acquire(const unsigned int *p) {
  unsigned int v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* Stores a 32-bit word with release semantics at system scope: this
 * thread's earlier loads and stores (and what it has observed) are visible
 * to whoever acquires the value. */
static __device__ __forceinline__ void symmem_dev_st_release(unsigned int *p, unsigned int v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Adds v to a 32-bit word atomically with release semantics at system scope
 * (no result: a reduction, which needs no round trip to a peer). */
static __device__ __forceinline__ void symmem_dev_add_release(unsigned int *p, unsigned int v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* The GPU's global nanosecond timer. */
static __device__ __forceinline__ unsigned long long symmem_dev_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Whether a count has reached expected (wrap-around safe). */
static __device__ __forceinline__ bool symmem_dev_reached(unsigned int count, unsigned int expected) {
  return (int)(count - expected) >= 0;
}

/* ---- 16-byte vectors ----------------------------------------------------- */

/* 16 bytes moved as one; ptr must be 16-byte aligned (peers' memory too:
 * NVLink carries 16-byte loads and stores as such). */
struct __align__(16) symmem_vec16 {
  unsigned int w[4];
};

/* Loads 16 bytes (a plain load: order it with a barrier or an acquire). */
static __device__ __forceinline__ symmem_vec16 symmem_dev_load16(const void *ptr) {
  return *(const symmem_vec16 *)ptr;
}

/* Stores 16 bytes (a plain store: publish it with a barrier or a release). */
static __device__ __forceinline__ void symmem_dev_store16(void *ptr, symmem_vec16 v) {
  *(symmem_vec16 *)ptr = v;
}

/* ---- the view ------------------------------------------------------------ */

/* Rank r's block plus offset bytes (r in [0, world)). */
static __device__ __forceinline__ char *symmem_dev_ptr(const symmem_device_view &v, int r,
                                                      unsigned long long offset) {
  return (char *)v.buffers[r] + offset;
}

/* Word i of rank r's device region. */
static __device__ __forceinline__ unsigned int *symmem_dev_region(const symmem_device_view &v, int r,
                                                                  unsigned long long i) {
  return (unsigned int *)((char *)v.pads[r] + v.pad_size) + i;
}

/* Word i of set s of rank r's device region. */
static __device__ __forceinline__ unsigned int *symmem_dev_set_word(const symmem_device_view &v, int r, int s,
                                                                    int i) {
  return symmem_dev_region(v, r, SYMMEM_DEV_HEADER_WORDS + (unsigned long long)s * 2 * v.world + i);
}

/* The argument slot (set s, sender) of rank r's region: two 64-bit words
 * (s < SYMMEM_DEV_LIBRARY_SETS). */
static __device__ __forceinline__ unsigned long long *symmem_dev_arg_slot(const symmem_device_view &v, int r, int s,
                                                                         int sender) {
  unsigned long long a = (unsigned long long)symmem_dev_region(v, r, SYMMEM_DEV_HEADER_WORDS +
                                                                         (unsigned long long)SYMMEM_DEV_SETS * 2 * v.world);
  a = (a + 7) & ~7ull;
  return (unsigned long long *)a + 2 * ((unsigned long long)s * v.world + sender);
}

/* ---- put / get (thread level) -------------------------------------------- */

/* Copies n bytes from src to dst, both of which may be any rank's memory,
 * with the threads [tid, tid + nthreads) of the caller cooperating: 16-byte
 * moves where src and dst share their alignment, single bytes elsewhere.
 * Plain stores: publish them with a barrier or a signal. */
static __device__ __forceinline__ void symmem_dev_copy(void *dst, const void *src, unsigned long long n,
                                                       unsigned long long tid, unsigned long long nthreads) {
  char *d = (char *)dst;
  const char *s = (const char *)src;
  if ((((unsigned long long)d ^ (unsigned long long)s) & 15) != 0) {
    for (unsigned long long i = tid; i < n; i += nthreads)
      d[i] = s[i];
    return;
  }
  unsigned long long head = (16 - ((unsigned long long)d & 15)) & 15;
  if (head > n)
    head = n;
  unsigned long long nvec = (n - head) / 16;
  for (unsigned long long i = tid; i < head; i += nthreads)
    d[i] = s[i];
  /* Four 16-byte loads in flight per thread before their stores. */
  char *dv = d + head;
  const char *sv = s + head;
  for (unsigned long long i = tid; i < nvec; i += 4 * nthreads) {
    symmem_vec16 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (i + u * nthreads < nvec)
        v[u] = symmem_dev_load16(sv + 16 * (i + u * nthreads));
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (i + u * nthreads < nvec)
        symmem_dev_store16(dv + 16 * (i + u * nthreads), v[u]);
  }
  for (unsigned long long i = head + 16 * nvec + tid; i < n; i += nthreads)
    d[i] = s[i];
}

/* Writes n bytes from src (this rank's memory) to offset of rank dst's
 * block, with the calling block's threads. */
static __device__ __forceinline__ void symmem_dev_put_block(const symmem_device_view &v, int dst,
                                                            unsigned long long offset, const void *src,
                                                            unsigned long long n) {
  symmem_dev_copy(symmem_dev_ptr(v, dst, offset), src, n, threadIdx.x, blockDim.x);
}

/* Reads n bytes at offset of rank src's block into dst, with the calling
 * block's threads. */
static __device__ __forceinline__ void symmem_dev_get_block(const symmem_device_view &v, int src,
                                                            unsigned long long offset, void *dst,
                                                            unsigned long long n) {
  symmem_dev_copy(dst, symmem_dev_ptr(v, src, offset), n, threadIdx.x, blockDim.x);
}

/* ---- signals and waits (thread level) ------------------------------------ */

/* Records a failure of cause (SYMMEM_DEV_CAUSE_*) with (peer, set) in our
 * region's word 0 (first failure only). */
static __device__ __forceinline__ void symmem_dev_fail_cause(const symmem_device_view &v, unsigned int cause, int peer,
                                                             int set) {
  atomicCAS(symmem_dev_region(v, v.rank, 0), 0u,
            0x80000000u | (cause & 3) << 29 | ((unsigned)peer & 0x1fff) << 16 | ((unsigned)set & 0xffff));
#ifdef SYMMEM_DEV_TRAP_ON_TIMEOUT
  __trap();
#endif
}

/* Records a failed wait (a timeout) in our region's word 0. */
static __device__ __forceinline__ void symmem_dev_fail(const symmem_device_view &v, int peer, int set) {
  symmem_dev_fail_cause(v, SYMMEM_DEV_CAUSE_TIMEOUT, peer, set);
}

/* Whether a wait on set should give up before its timeout: the abort word
 * is set (a peer exited: recorded in the flag with this set) or the flag
 * already records a mismatch. */
static __device__ __forceinline__ bool symmem_dev_aborted(const symmem_device_view &v, int set) {
  unsigned int ab = *(volatile unsigned int *)symmem_dev_region(v, v.rank, 1);
  if (ab != 0) {
    symmem_dev_fail_cause(v, SYMMEM_DEV_CAUSE_PEER_EXITED, (int)(ab >> 16 & 0x1fff), set);
    return true;
  }
  unsigned int fl = *(volatile unsigned int *)symmem_dev_region(v, v.rank, 0);
  return (fl >> 29) == (4u | SYMMEM_DEV_CAUSE_MISMATCH);
}

/* Waits until the word at p has reached expected (wrap-around safe), for at
 * most the view's timeout; on expiry records (peer, set) in the error flag
 * and returns false; false at once when symmem_dev_aborted. Acquire at
 * system scope. */
static __device__ __forceinline__ bool symmem_dev_wait_reached(const symmem_device_view &v, const unsigned int *p,
                                                               unsigned int expected, int peer, int set) {
  if (symmem_dev_reached(symmem_dev_ld_acquire(p), expected))
    return true;
  unsigned long long limit = v.timeout_ns ? v.timeout_ns : SYMMEM_DEV_DEFAULT_TIMEOUT_NS;
  unsigned long long start = symmem_dev_globaltimer();
  while (!symmem_dev_reached(symmem_dev_ld_acquire(p), expected)) {
    if (symmem_dev_aborted(v, set))
      return false;
    if (symmem_dev_globaltimer() - start > limit) {
      symmem_dev_fail(v, peer, set);
      return false;
    }
  }
  return true;
}

/* Signals rank peer on set s: adds 1 to our arrivals there (release). */
static __device__ __forceinline__ void symmem_dev_signal(const symmem_device_view &v, int peer, int set) {
  symmem_dev_add_release(symmem_dev_set_word(v, peer, set, v.rank), 1);
}

/* Consumes one signal from rank peer on set s: waits until peer's arrivals
 * in our region reach seen + 1, then counts it seen. Only one thread of the
 * rank may wait for a given (peer, set) at a time. false on timeout. */
static __device__ __forceinline__ bool symmem_dev_wait(const symmem_device_view &v, int peer, int set) {
  unsigned int *seen = symmem_dev_set_word(v, v.rank, set, v.world + peer);
  unsigned int want = *(volatile unsigned int *)seen + 1;
  if (!symmem_dev_wait_reached(v, symmem_dev_set_word(v, v.rank, set, peer), want, peer, set))
    return false;
  *(volatile unsigned int *)seen = want;
  return true;
}

/* ---- barriers ------------------------------------------------------------- */

/* Block-level barrier across ranks on (library or user) set s: the calling
 * block of every rank calls it (the same block index everywhere by
 * convention), every thread of the block. Thread p (p < world, p != rank)
 * signals and waits for rank p, so blockDim.x must be >= world. Returns true
 * in every thread, or false in every thread when a wait timed out. */
static __device__ __forceinline__ bool symmem_dev_barrier_block_set(const symmem_device_view &v, int set) {
  __syncthreads();
  bool ok = true;
  int p = threadIdx.x;
  if (p < v.world && p != v.rank) {
    symmem_dev_signal(v, p, set);
    ok = symmem_dev_wait(v, p, set);
  }
  return __syncthreads_and(ok);
}

/* symmem_dev_barrier_block_set on user set u in [0, SYMMEM_DEV_USER_SETS). */
static __device__ __forceinline__ bool symmem_dev_barrier_block(const symmem_device_view &v, int u) {
  return symmem_dev_barrier_block_set(v, SYMMEM_DEV_LIBRARY_SETS + u);
}

/* Grid barrier of this rank's grid alone, on set s's counter (seen[rank]):
 * every block of the grid calls it. Needs every block resident at once (a
 * grid no larger than the GPU holds; cooperative launch guarantees it).
 * Block 0 adds 0x80000000 - (gridDim - 1), every other block 1, so one
 * barrier adds exactly 2^31 and the top bit flips: wrap-around safe, no
 * reset. Bounded like every wait. */
static __device__ __forceinline__ bool symmem_dev_grid_sync_set(const symmem_device_view &v, int set) {
  __syncthreads();
  bool ok = true;
  if (threadIdx.x == 0) {
    unsigned int *ctr = symmem_dev_set_word(v, v.rank, set, v.world + v.rank);
    unsigned int nb = gridDim.x * gridDim.y * gridDim.z;
    bool first = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
    unsigned int add = first ? 0x80000000u - (nb - 1) : 1u;
    unsigned int old;
    __threadfence();
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(ctr), "r"(add) : "memory");
    unsigned long long limit = v.timeout_ns ? v.timeout_ns : SYMMEM_DEV_DEFAULT_TIMEOUT_NS;
    unsigned long long start = symmem_dev_globaltimer();
    for (;;) {
      unsigned int cur;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(cur) : "l"(ctr) : "memory");
      if ((cur ^ old) & 0x80000000u)
        break;
      if (symmem_dev_globaltimer() - start > limit) {
        symmem_dev_fail(v, v.rank, set);
        ok = false;
        break;
      }
    }
  }
  return __syncthreads_and(ok);
}

/* Grid-level barrier across ranks on set s: every block of every rank's
 * grid calls it. A grid sync, then block 0 meets the peers' blocks 0, then a
 * grid sync again: after it, everything any block of any rank wrote before
 * it is visible to every block of every rank. Needs a resident grid (see
 * symmem_dev_grid_sync_set) and blockDim.x >= world. */
static __device__ __forceinline__ bool symmem_dev_barrier_grid_set(const symmem_device_view &v, int set) {
  bool ok = symmem_dev_grid_sync_set(v, set);
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)
    ok = symmem_dev_barrier_block_set(v, set) && ok;
  return symmem_dev_grid_sync_set(v, set) && ok;
}

/* symmem_dev_barrier_grid_set on user set u in [0, SYMMEM_DEV_USER_SETS). */
static __device__ __forceinline__ bool symmem_dev_barrier_grid(const symmem_device_view &v, int u) {
  return symmem_dev_barrier_grid_set(v, SYMMEM_DEV_LIBRARY_SETS + u);
}

/* ---- element conversions (bit for bit the host backend's) --------------- */

/* bfloat16 bits -> float (exact). */
static __device__ __forceinline__ float symmem_dev_bf16_to_float(unsigned short b) {
  return __uint_as_float((unsigned int)b << 16);
}

/* float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN. */
static __device__ __forceinline__ unsigned short symmem_dev_float_to_bf16(float f) {
  unsigned int b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u)
    return (unsigned short)((b >> 16) | 0x40);
  b += 0x7fffu + ((b >> 16) & 1);
  return (unsigned short)(b >> 16);
}

/* IEEE half bits -> float (exact). */
static __device__ __forceinline__ float symmem_dev_f16_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

/* float -> IEEE half bits, round to nearest even. */
static __device__ __forceinline__ unsigned short symmem_dev_float_to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

#endif /* __CUDACC__ */

/* ---- host side (any C++ compiler; not under NVRTC, which has no host code) */

#ifndef __CUDACC_RTC__

/* Fills a view from the values of a handle (include/symmem.h):
 *   symmem_dev_view_init_host(&v, symmem_handle_buffer_ptrs_dev(h),
 *       symmem_handle_signal_pad_ptrs_dev(h), symmem_handle_signal_pad_size(h),
 *       symmem_handle_rank(h), symmem_handle_world_size(h), 0); */
static inline void symmem_dev_view_init_host(symmem_device_view *v, void *const *buffers_dev,
                                             void *const *pads_dev, unsigned long long pad_size, int rank,
                                             int world, unsigned long long timeout_ns) {
  v->buffers = buffers_dev;
  v->pads = (unsigned int *const *)pads_dev;
  v->pad_size = pad_size;
  v->timeout_ns = timeout_ns;
  v->rank = rank;
  v->world = world;
}
#endif /* __CUDACC_RTC__ */

#endif /* SYMMEM_DEVICE_CUH */
