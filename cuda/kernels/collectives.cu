/*
 * collectives.cu - libsymmem's collectives as CUDA kernels, embedded in the
 * library and compiled at first use with NVRTC for the device at hand
 * (cuda/kernels.go). Built on include/symmem_device.cuh, which NVRTC gets as
 * an in-memory header. Semantics: core/symm/coll/coll.go, Note [Collectives];
 * the host backend computes exactly the same results.
 *
 * One kernel per call, whatever the phase count: a block barrier with the
 * peers' same-index blocks (the inputs are ready; it also compares the
 * call's arguments with the peers', symmem_coll_open), the work, spread over
 * the whole grid with 16-byte loads and stores (two-shot pull: its two
 * phases with a block barrier between them), a block barrier again (every
 * peer is done reading our memory; two-shot push: its stores into peers
 * are visible). Block b of collective channel c uses device set c*64 + b.
 *
 * Which barriers publish (symmem_coll_barrier): two-shot push's closing
 * barrier, whose stores into peers' outs must be visible to them when it
 * returns, and two-shot pull's middle barrier, after which the peers read
 * the slice we reduced into our out, signal with release at system scope
 * (a system-scope fence that waits for every outstanding store: the
 * costliest part of a barrier). The others only order reads before a
 * peer's later writes, or announce an
 * input that earlier kernels of the stream wrote (a kernel's writes are
 * performed in its GPU's memory when the next kernel of the stream starts,
 * and peers read that memory over NVLink): their signals are relaxed, as
 * torch's symmetric-memory kernels do at the start of a collective. Waits
 * always acquire.
 */
#include "symmem_device.cuh"

/* The kernels' one parameter; cuda/kernels.go packs the same layout. */
struct symmem_coll_params {
  symmem_device_view view;       /* 0 */
  unsigned long long in_offset;  /* 40: input offset in every rank's block */
  char *out;                     /* 48: this rank's output */
  long long out_offset;          /* 56: out's offset in every block (two-shot), or -1 */
  unsigned long long count;      /* 64: elements of each rank's input (all-gather: bytes) */
  int kind;                      /* 72: 0 all-reduce, 2 reduce-scatter (all-gather has its kernel; 3 an
                                    all-to-all's low-latency call, in the all-gather's kernel) */
  int algo;                      /* 76: 1 one-shot, 2 two-shot (push), 3 two-shot (pull) */
  int op;                        /* 80: 0 sum, 1 max, 2 min (the kernel's own; checked by the host) */
  int set_base;                  /* 84: the channel's first device set */
  unsigned int digest;           /* 88: digest of the call's arguments (Note [Collective agreement]) */
  int sliced;                    /* 92: all-gather: rank q's input at in_offset + q*count */
  unsigned long long ll_offset;  /* 96: low-latency buffers' offset in every pad (algo 4) */
  unsigned long long ll_slot;    /* 104: bytes of one sender's slot there */
  unsigned int flags;            /* 112: SYMMEM_COLL_UNCHECKED: no argument agreement */
  unsigned int pad0;             /* 116 */
  /* 120: rank r's low-latency buffers (its pad + ll_offset), for r < world
   * <= SYMMEM_LL_DIRECT_RANKS: the path's pointers come from the kernel's
   * parameters rather than from loads of the view's device arrays. */
  char *ll_base[8];
  /* 184: the pinned host word that mirrors our stop word (0: none); see
   * symmem_coll_stop. */
  unsigned int *stop_mirror;
};
#define SYMMEM_LL_DIRECT_RANKS 8
static_assert(sizeof(symmem_device_view) == 40, "symmem_device_view layout");
static_assert(sizeof(symmem_coll_params) == 192, "symmem_coll_params layout");

/* params.algo of the low-latency path, and params.flags. */
#define SYMMEM_COLL_ALGO_LL 4
#define SYMMEM_COLL_UNCHECKED 1u

/* Programmatic dependent launch (sm_90 on): the library launches its
 * kernels allowed to start before the previous kernel of the stream has
 * finished, so that their launch overlaps its tail. Nothing a previous
 * kernel wrote may be touched before symmem_pdl_wait, which returns once
 * that kernel has completed and its memory is visible (at once when the
 * kernel was launched without the attribute). symmem_pdl_release lets the
 * next kernel of the stream be launched now; it still waits for this one
 * to finish before touching memory, if it was launched to do so. */
static __device__ __forceinline__ void symmem_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void symmem_pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

#define SYMMEM_COLL_THREADS 512
/* Vectors per thread in flight in the reduction loops. */
#define SYMMEM_COLL_UNROLL 4
/* Ranks whose loads of those vectors are in flight at once in the large
 * reduction loop (SYMMEM_COLL_PAIR * SYMMEM_COLL_UNROLL vectors). */
#define SYMMEM_COLL_PAIR 2
/* The same for in-place one-shot, whose rounds hold every rank's loads of
 * each item (SYMMEM_COLL_FANIN at once) in registers: 2 items per thread
 * keep 1 MiB in one round at 64 blocks, and compile in half the time of 4
 * (the first collective waits for that compile). */
#define SYMMEM_COLL_INPLACE_UNROLL 2
/* Ranks whose loads of one vector a thread has in flight at once (small
 * collectives: one vector per thread). */
#define SYMMEM_COLL_FANIN 8

/* Stopping the group's collectives (core/symm/coll/coll.go, Note [Failed
 * collectives]). A block whose wait gave up (the cause is in the error
 * flag) calls symmem_coll_stop with one thread: the flag goes into our stop
 * word and, if it was the first there, that we gave up into every peer's
 * (at system scope, so that a late peer's next kernel and its waits see
 * it), and the stop word into the pinned host mirror, which the library
 * reads before every collective. A kernel whose stop word is already set
 * (symmem_coll_stopped) only mirrors it and returns without arriving
 * anywhere: the counts of the group are out of step, and a call that ran
 * would read a peer's memory of another call. */
static __device__ __noinline__ void symmem_coll_stop(const symmem_device_view &v, unsigned int *mirror, int set) {
  unsigned int *own = symmem_dev_region(v, v.rank, SYMMEM_DEV_STOP_WORD);
  unsigned int fl = *(volatile unsigned int *)symmem_dev_region(v, v.rank, 0);
  if (fl == 0)
    fl = 0x80000000u | SYMMEM_DEV_CAUSE_TIMEOUT << 29 | ((unsigned)set & 0xffff);
  if (atomicCAS_system(own, 0u, fl) == 0u) {
    const unsigned int gave = 0x80000000u | SYMMEM_DEV_CAUSE_GAVE_UP << 29 | ((unsigned)v.rank & 0x1fff) << 16 |
                              (fl >> 29 & 3) << 12 | (fl & 0xfff);
    for (int q = 0; q < v.world; q++)
      if (q != v.rank)
        atomicCAS_system(symmem_dev_region(v, q, SYMMEM_DEV_STOP_WORD), 0u, gave);
  }
  /* Our flag says so too, unless it holds a failure of its own: a kernel
   * that found the group stopped returns without recording anything else. */
  atomicCAS(symmem_dev_region(v, v.rank, 0), 0u, *(volatile unsigned int *)own);
  if (mirror) {
    const unsigned int st = *(volatile unsigned int *)own;
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(mirror), "r"(st) : "memory");
  }
}

/* Whether our stop word is set, the same in every thread of the block; if
 * so, thread 0 has mirrored it. */
static __device__ __forceinline__ bool symmem_coll_stopped(const symmem_device_view &v, unsigned int *mirror,
                                                           int set) {
  bool st = false;
  if (threadIdx.x == 0) {
    const unsigned int w = *(volatile unsigned int *)symmem_dev_region(v, v.rank, SYMMEM_DEV_STOP_WORD);
    st = w != 0;
    if (st)
      symmem_coll_stop(v, mirror, set);
  }
  return __syncthreads_or(st);
}

/* symmem_dev_barrier_block_set with the signal's ordering chosen: publish
 * (release at system scope: our stores, peers' memory included, are visible
 * to the peers after the barrier) or not (relaxed: only this block's
 * completed loads and earlier kernels' writes are ordered before it; see the
 * head of this file). Same counts, same sets, same bounded wait; a wait
 * that gives up stops the group's collectives (symmem_coll_stop). */
template <class P> /* symmem_coll_params, symmem_a2a_params: their view and stop_mirror */
static __device__ __forceinline__ bool symmem_coll_barrier(const P &params, int set, bool publish) {
  const symmem_device_view &v = params.view;
  __syncthreads();
  bool ok = true;
  int p = threadIdx.x;
  if (p < v.world && p != v.rank) {
    unsigned int *arrivals = symmem_dev_set_word(v, p, set, v.rank);
    if (publish)
      symmem_dev_add_release(arrivals, 1);
    else
      asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(arrivals), "r"(1u) : "memory");
    ok = symmem_dev_wait(v, p, set);
  }
  if (__syncthreads_and(ok))
    return true;
  if (threadIdx.x == 0)
    symmem_coll_stop(v, params.stop_mirror, set);
  return false;
}

/* The opening barrier of a collective, which also compares the call's
 * arguments with every peer's (core/symm/coll/coll.go, Note [Collective
 * agreement]): thread p stores arrival << 32 | digest into peer p's argument
 * slot (set, rank), where arrival is the number of the arrival it then makes
 * (relaxed, as symmem_coll_barrier's unpublishing signal), waits for p's
 * arrival, then reads p's slot in our region until it carries that arrival
 * number (the two stores of p are not ordered: the tag shows a stale slot)
 * and compares digests. A tag past the arrival means p already failed this
 * call and moved on. A difference records SYMMEM_DEV_CAUSE_MISMATCH with p;
 * false in every thread then, before any data moved. */
/* Waits until peer p's argument slot in our region (set, p) carries arrival
 * n, then compares it with mine (arrival n << 32 | our digest): true when
 * equal; a timeout, an abort or a difference records the cause in the
 * error flag and returns false. Kernels use the slot's two 64-bit words by
 * the parity of the arrival (the host backend, which runs no kernels, keeps
 * the packed arguments in the second): a peer on the low-latency path may
 * publish its next call's arrival before we read this one (it waits for no
 * barrier of ours), but never the one after it. */
static __device__ __forceinline__ bool symmem_coll_agree(const symmem_device_view &v, int set, int p, unsigned int n,
                                                         unsigned long long mine) {
  const unsigned long long *slot = symmem_dev_arg_slot(v, v.rank, set, p) + (n & 1);
  unsigned long long limit = v.timeout_ns ? v.timeout_ns : SYMMEM_DEV_DEFAULT_TIMEOUT_NS;
  unsigned long long start = symmem_dev_globaltimer();
  unsigned long long theirs;
  for (;;) {
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(theirs) : "l"(slot) : "memory");
    if (symmem_dev_reached((unsigned int)(theirs >> 32), n))
      break;
    if (symmem_dev_aborted(v, set) || symmem_dev_globaltimer() - start > limit) {
      symmem_dev_fail(v, p, set);
      return false;
    }
  }
  if (theirs != mine) {
    symmem_dev_fail_cause(v, SYMMEM_DEV_CAUSE_MISMATCH, p, set);
    return false;
  }
  return true;
}

/* Publishes this call's arguments to peer p for set (thread p's part of
 * symmem_coll_open): arrival n << 32 | digest into p's slot (set, rank),
 * relaxed, then the arrival itself: relaxed, or with release at system
 * scope when the block's earlier stores must be visible to p once it has
 * seen the arrival (publish). Returns the word published. */
static __device__ __forceinline__ unsigned long long symmem_coll_publish(const symmem_device_view &v, int set, int p,
                                                                         unsigned int n, unsigned int digest,
                                                                         bool publish = false) {
  const unsigned long long mine = (unsigned long long)n << 32 | digest;
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(symmem_dev_arg_slot(v, p, set, v.rank) + (n & 1)),
               "l"(mine)
               : "memory");
  if (publish)
    symmem_dev_add_release(symmem_dev_set_word(v, p, set, v.rank), 1);
  else
    asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(symmem_dev_set_word(v, p, set, v.rank)), "r"(1u)
                 : "memory");
  return mine;
}

/* The opening barrier also refuses to run on a group whose collectives
 * stopped: before it arrives anywhere (a kernel enqueued before the failure
 * was seen, a graph's replay), and again after its waits (a peer that gave
 * up after counting its arrival here). publish: the arrivals release the
 * block's earlier stores to the peers (the all-to-all's split tables). */
template <class P> /* symmem_coll_params, symmem_a2a_params: view, stop_mirror, digest, flags */
static __device__ __forceinline__ bool symmem_coll_open(const P &params, int set, bool publish = false) {
  const symmem_device_view &v = params.view;
  if (symmem_coll_stopped(v, params.stop_mirror, set))
    return false;
  if (params.flags & SYMMEM_COLL_UNCHECKED)
    return symmem_coll_barrier(params, set, publish) && !symmem_coll_stopped(v, params.stop_mirror, set);
  bool ok = true;
  int p = threadIdx.x;
  if (p < v.world && p != v.rank) {
    const unsigned int n = *(volatile unsigned int *)symmem_dev_set_word(v, v.rank, set, v.world + p) + 1;
    const unsigned long long mine = symmem_coll_publish(v, set, p, n, params.digest, publish);
    ok = symmem_dev_wait(v, p, set) && symmem_coll_agree(v, set, p, n, mine);
  }
  if (!__syncthreads_and(ok)) {
    if (threadIdx.x == 0)
      symmem_coll_stop(v, params.stop_mirror, set);
    return false;
  }
  return !symmem_coll_stopped(v, params.stop_mirror, set);
}

/* Element traits: E elements per 16-byte vector, acc_t the accumulator. */
template <int DT> struct symmem_elem;

template <> struct symmem_elem<0> { /* float32 */
  typedef float acc_t;
  enum { E = 4, SIZE = 4 };
  static __device__ __forceinline__ float get(const symmem_vec16 &v, int i) { return __uint_as_float(v.w[i]); }
  static __device__ __forceinline__ void put(symmem_vec16 &v, int i, float x) { v.w[i] = __float_as_uint(x); }
  static __device__ __forceinline__ float load1(const char *p) { return *(const float *)p; }
  static __device__ __forceinline__ void store1(char *p, float x) { *(float *)p = x; }
};

template <> struct symmem_elem<3> { /* int32 */
  typedef int acc_t;
  enum { E = 4, SIZE = 4 };
  static __device__ __forceinline__ int get(const symmem_vec16 &v, int i) { return (int)v.w[i]; }
  static __device__ __forceinline__ void put(symmem_vec16 &v, int i, int x) { v.w[i] = (unsigned int)x; }
  static __device__ __forceinline__ int load1(const char *p) { return *(const int *)p; }
  static __device__ __forceinline__ void store1(char *p, int x) { *(int *)p = x; }
};

/* 16-bit types: lane i is half (i & 1) of word i / 2. */
template <bool BF> struct symmem_elem16 {
  typedef float acc_t;
  enum { E = 8, SIZE = 2 };
  static __device__ __forceinline__ float wide(unsigned short h) {
    return BF ? symmem_dev_bf16_to_float(h) : symmem_dev_f16_to_float(h);
  }
  static __device__ __forceinline__ unsigned short narrow(float f) {
    return BF ? symmem_dev_float_to_bf16(f) : symmem_dev_float_to_f16(f);
  }
  static __device__ __forceinline__ float get(const symmem_vec16 &v, int i) {
    return wide((unsigned short)(v.w[i >> 1] >> ((i & 1) * 16)));
  }
  static __device__ __forceinline__ void put(symmem_vec16 &v, int i, float x) {
    unsigned int sh = (i & 1) * 16;
    v.w[i >> 1] = (v.w[i >> 1] & ~(0xffffu << sh)) | ((unsigned int)narrow(x) << sh);
  }
  static __device__ __forceinline__ float load1(const char *p) { return wide(*(const unsigned short *)p); }
  static __device__ __forceinline__ void store1(char *p, float x) { *(unsigned short *)p = narrow(x); }
};
template <> struct symmem_elem<1> : symmem_elem16<false> {}; /* float16 */
template <> struct symmem_elem<2> : symmem_elem16<true> {};  /* bfloat16 */

/* OP on two values, as the host backend (core/symm/coll/float.go): max and min
 * keep the other operand when one is NaN; int32 sums wrap. OP is a template
 * argument (one kernel per dtype and op): a run-time op would put all three
 * in every unrolled reduction, tripling the code NVRTC compiles at first
 * use (Note [Kernels compiled at run time] in cuda/kernels.go). */
template <int OP> static __device__ __forceinline__ float symmem_reduce(float a, float b) {
  if (OP == 1)
    return (a != a || b > a) ? b : a;
  if (OP == 2)
    return (a != a || b < a) ? b : a;
  return a + b;
}
template <int OP> static __device__ __forceinline__ int symmem_reduce(int a, int b) {
  if (OP == 1)
    return b > a ? b : a;
  if (OP == 2)
    return b < a ? b : a;
  return (int)((unsigned int)a + (unsigned int)b);
}

/* The element range [lo, hi) this rank reduces, and where it goes. */
struct symmem_reduce_plan {
  unsigned long long lo, n;  /* elements */
  unsigned long long src;    /* offset of element lo in every block */
  bool vec;                  /* 16-byte path (src and destinations aligned) */
  unsigned long long items;  /* vectors (+1 for a tail), or elements */
};

template <int DT>
static __device__ __forceinline__ symmem_reduce_plan symmem_plan(const symmem_coll_params &p, int me) {
  typedef symmem_elem<DT> T;
  const int W = p.view.world;
  symmem_reduce_plan pl;
  unsigned long long lo = 0, hi = p.count;
  if (p.kind == 2) { /* reduce-scatter: slice me */
    unsigned long long per = p.count / W;
    lo = me * per;
    hi = lo + per;
  } else if (p.algo >= 2) { /* two-shot: slices of whole vectors */
    unsigned long long nv = (p.count + T::E - 1) / T::E;
    unsigned long long per = (nv + W - 1) / W * T::E;
    lo = me * per < p.count ? me * per : p.count;
    hi = (me + 1) * per < p.count ? (me + 1) * per : p.count;
  }
  pl.lo = lo;
  pl.n = hi - lo;
  pl.src = p.in_offset + lo * T::SIZE;
  unsigned long long dst = p.algo >= 2 && p.kind == 0 ? (unsigned long long)p.out_offset + lo * T::SIZE
                                                      : (unsigned long long)p.out;
  pl.vec = ((pl.src | dst) & 15) == 0;
  pl.items = pl.vec ? pl.n / T::E + (pl.n % T::E != 0) : pl.n;
  return pl;
}

/* The reduction over every rank, in rank order, of the 16-byte vector at
 * offset off of every block, into r. Every rank's load is in flight at once
 * (SYMMEM_COLL_FANIN ranks at a time), so a vector costs one round trip to
 * the peers rather than one per rank. */
template <int DT, int OP>
static __device__ __forceinline__ void symmem_reduce_vec(const symmem_coll_params &p, unsigned long long off,
                                                         symmem_vec16 &r) {
  typedef symmem_elem<DT> T;
  const symmem_device_view &v = p.view;
  typename T::acc_t acc[T::E];
  for (int q0 = 0; q0 < v.world; q0 += SYMMEM_COLL_FANIN) {
    symmem_vec16 xs[SYMMEM_COLL_FANIN];
#pragma unroll
    for (int j = 0; j < SYMMEM_COLL_FANIN; j++)
      if (q0 + j < v.world)
        xs[j] = symmem_dev_load16(symmem_dev_ptr(v, q0 + j, off));
#pragma unroll
    for (int j = 0; j < SYMMEM_COLL_FANIN; j++)
      if (q0 + j < v.world)
#pragma unroll
        for (int k = 0; k < T::E; k++)
          acc[k] = q0 + j == 0 ? T::get(xs[j], k) : symmem_reduce<OP>(acc[k], T::get(xs[j], k));
  }
#pragma unroll
  for (int k = 0; k < T::E; k++)
    T::put(r, k, acc[k]);
}

/* The cold part of symmem_reduce_item: item i element by element into tail
 * (a tail, or every item of an unaligned plan: up to E elements), out of
 * line so that its loops are compiled once per kernel rather than at every
 * unrolled call site. */
template <int DT, int OP>
static __device__ __noinline__ int symmem_reduce_elems(const symmem_coll_params &p, const symmem_reduce_plan &pl,
                                                        unsigned long long i, typename symmem_elem<DT>::acc_t *tail) {
  typedef symmem_elem<DT> T;
  typedef typename T::acc_t A;
  const symmem_device_view &v = p.view;
  const int W = v.world;
  /* Elements [first, last) of the plan, one at a time. */
  unsigned long long first = pl.vec ? i * T::E : i;
  unsigned long long last = pl.vec ? pl.n : i + 1;
  int m = 0;
  for (unsigned long long e = first; e < last; e++, m++) {
    A acc = T::load1(symmem_dev_ptr(v, 0, pl.src + e * T::SIZE));
    for (int q = 1; q < W; q++)
      acc = symmem_reduce<OP>(acc, T::load1(symmem_dev_ptr(v, q, pl.src + e * T::SIZE)));
    tail[m] = acc;
  }
  return m;
}

/* Reduces item i of the plan over every rank into r (a whole vector), or
 * element by element into tail (symmem_reduce_elems). */
template <int DT, int OP>
static __device__ __forceinline__ int symmem_reduce_item(const symmem_coll_params &p, const symmem_reduce_plan &pl,
                                                         unsigned long long i, symmem_vec16 &r,
                                                         typename symmem_elem<DT>::acc_t *tail) {
  typedef symmem_elem<DT> T;
  if (pl.vec && (i + 1) * T::E <= pl.n) {
    symmem_reduce_vec<DT, OP>(p, pl.src + 16 * i, r);
    return -1;
  }
  return symmem_reduce_elems<DT, OP>(p, pl, i, tail);
}

/* Stores item i's result at dst (the plan's element 0 there). */
template <int DT>
static __device__ __forceinline__ void symmem_store_item(char *dst, const symmem_reduce_plan &pl, unsigned long long i,
                                                         int m, const symmem_vec16 &r,
                                                         const typename symmem_elem<DT>::acc_t *tail) {
  typedef symmem_elem<DT> T;
  if (m < 0) {
    symmem_dev_store16(dst + 16 * i, r);
    return;
  }
  unsigned long long first = pl.vec ? i * T::E : i;
  for (int k = 0; k < m; k++)
    T::store1(dst + (first + k) * T::SIZE, tail[k]);
}

/* Where the plan's element 0 goes in the out of rank (me + k) % world:
 * k = 0 is dst, here; two-shot push stores slice me into every rank's out
 * (k = 0 .. world-1), which only this rank reads or writes. */
template <int DT>
static __device__ __forceinline__ char *symmem_push_dst(const symmem_coll_params &p, const symmem_reduce_plan &pl,
                                                        char *dst, int k) {
  if (k == 0)
    return dst;
  return symmem_dev_ptr(p.view, (p.view.rank + k) % p.view.world, (unsigned long long)p.out_offset) +
         pl.lo * symmem_elem<DT>::SIZE;
}

/* Two-shot pull's second phase for slice q: the slice as rank q reduced it,
 * read from rank q's out into ours, item by item exactly as rank q's
 * threads reduced them (whole vector i by thread i % nthreads, then the
 * tail or every element as symmem_coll_reduce's tail loop), so that each
 * block reads only what the same-index block of rank q wrote before their
 * block barrier. */
template <int DT>
static __device__ __forceinline__ void symmem_pull_slice(char *dst, const char *src, const symmem_reduce_plan &pl,
                                                         unsigned long long tid, unsigned long long nthreads) {
  typedef symmem_elem<DT> T;
  const unsigned long long nfull = pl.vec ? pl.n / T::E : 0;
  for (unsigned long long i0 = tid; i0 < nfull; i0 += SYMMEM_COLL_UNROLL * nthreads) {
    symmem_vec16 x[SYMMEM_COLL_UNROLL];
#pragma unroll
    for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
      if (i0 + u * nthreads < nfull)
        x[u] = symmem_dev_load16(src + 16 * (i0 + u * nthreads));
#pragma unroll
    for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
      if (i0 + u * nthreads < nfull)
        symmem_dev_store16(dst + 16 * (i0 + u * nthreads), x[u]);
  }
  for (unsigned long long i = nfull + tid; i < pl.items; i += nthreads) {
    unsigned long long first = pl.vec ? i * T::E : i, last = pl.vec ? pl.n : i + 1;
    for (unsigned long long b = first * T::SIZE; b < last * T::SIZE; b++)
      dst[b] = src[b];
  }
}

template <int DT, int OP> static __device__ __forceinline__ void symmem_coll_reduce(const symmem_coll_params &p) {
  typedef symmem_elem<DT> T;
  const symmem_device_view &v = p.view;
  const int set = p.set_base + blockIdx.x;
  const symmem_reduce_plan pl = symmem_plan<DT>(p, v.rank);
  const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
  const bool two_shot = p.kind == 0 && p.algo >= 2;
  const bool pull = two_shot && p.algo == 3, push = two_shot && !pull;
  const bool in_place_one_shot = p.kind == 0 && !two_shot && p.out == symmem_dev_ptr(v, v.rank, p.in_offset);
  /* Where element 0 of the plan's result goes here: out, or (two-shot)
   * slice me of our own out, which no peer reads or writes before the
   * closing barrier (push) or the middle one (pull). */
  char *const dst = two_shot ? p.out + pl.lo * T::SIZE : p.out;
  symmem_vec16 r;
  typename T::acc_t tail[T::E];

  if (!symmem_coll_open(p, set))
    return;
  if (in_place_one_shot) {
    /* Every rank reads our input: each round reads SYMMEM_COLL_INPLACE_UNROLL
     * items per thread into registers, meets the peers, then stores (a
     * peer's round-r reads are done before its round-r arrival). No closing
     * barrier is needed: the last round's barrier came after every read. */
    const unsigned long long per_round = SYMMEM_COLL_INPLACE_UNROLL * nthreads;
    const unsigned long long rounds = (pl.items + per_round - 1) / per_round;
    symmem_vec16 rs[SYMMEM_COLL_INPLACE_UNROLL];
    typename T::acc_t tails[SYMMEM_COLL_INPLACE_UNROLL][T::E];
    int ms[SYMMEM_COLL_INPLACE_UNROLL];
    for (unsigned long long k = 0; k < rounds; k++) {
#pragma unroll
      for (int u = 0; u < SYMMEM_COLL_INPLACE_UNROLL; u++) {
        unsigned long long i = k * per_round + u * nthreads + tid;
        ms[u] = 0;
        if (i < pl.items)
          ms[u] = symmem_reduce_item<DT, OP>(p, pl, i, rs[u], tails[u]);
      }
      if (!symmem_coll_barrier(p, set, false))
        return;
#pragma unroll
      for (int u = 0; u < SYMMEM_COLL_INPLACE_UNROLL; u++) {
        unsigned long long i = k * per_round + u * nthreads + tid;
        if (i < pl.items)
          symmem_store_item<DT>(p.out, pl, i, ms[u], rs[u], tails[u]);
      }
    }
    return;
  }
  typedef typename T::acc_t A;
  const unsigned long long nfull = pl.vec ? pl.n / T::E : 0;
  if (nfull <= nthreads) {
    /* Small: at most one whole vector per thread, every rank's load of it
     * in flight at once (symmem_reduce_vec). */
    if (tid < nfull) {
      symmem_reduce_vec<DT, OP>(p, pl.src + 16 * tid, r);
      for (int k = 0; k < (push ? v.world : 1); k++)
        symmem_dev_store16(symmem_push_dst<DT>(p, pl, dst, k) + 16 * tid, r);
    }
  } else {
    /* Whole vectors, SYMMEM_COLL_UNROLL per thread at a time, from
     * SYMMEM_COLL_PAIR ranks at once: the loads of a batch from a pair of
     * ranks (at 2 ranks, every load of the batch) are in flight together
     * before they are reduced, then the stores. One rank at a time left the
     * local loads and the peer's in separate round trips. */
    for (unsigned long long i0 = tid; i0 < nfull; i0 += SYMMEM_COLL_UNROLL * nthreads) {
      A acc[SYMMEM_COLL_UNROLL][T::E];
      symmem_vec16 x[SYMMEM_COLL_PAIR][SYMMEM_COLL_UNROLL];
      for (int q0 = 0; q0 < v.world; q0 += SYMMEM_COLL_PAIR) {
#pragma unroll
        for (int j = 0; j < SYMMEM_COLL_PAIR; j++) {
          if (q0 + j < v.world) {
            const char *src = symmem_dev_ptr(v, q0 + j, pl.src);
#pragma unroll
            for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
              if (i0 + u * nthreads < nfull)
                x[j][u] = symmem_dev_load16(src + 16 * (i0 + u * nthreads));
          }
        }
#pragma unroll
        for (int j = 0; j < SYMMEM_COLL_PAIR; j++)
          if (q0 + j < v.world)
#pragma unroll
            for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
#pragma unroll
              for (int k = 0; k < T::E; k++)
                acc[u][k] = q0 + j == 0 ? T::get(x[j][u], k) : symmem_reduce<OP>(acc[u][k], T::get(x[j][u], k));
      }
#pragma unroll
      for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
#pragma unroll
        for (int k = 0; k < T::E; k++)
          T::put(x[0][u], k, acc[u][k]);
      /* Into our out, then (push) into every peer's. */
      for (int k = 0; k < (push ? v.world : 1); k++) {
        char *d = symmem_push_dst<DT>(p, pl, dst, k);
#pragma unroll
        for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
          if (i0 + u * nthreads < nfull)
            symmem_dev_store16(d + 16 * (i0 + u * nthreads), x[0][u]);
      }
    }
  }
  /* The tail (vector path) or every element (unaligned path). */
  for (unsigned long long i = nfull + tid; i < pl.items; i += nthreads) {
    int m = symmem_reduce_item<DT, OP>(p, pl, i, r, tail);
    for (int k = 0; k < (push ? v.world : 1); k++)
      symmem_store_item<DT>(symmem_push_dst<DT>(p, pl, dst, k), pl, i, m, r, tail);
  }
  if (pull) {
    /* Our slice is reduced into our out: publish it (release at system
     * scope), then read every peer's reduced slice from its out into ours
     * (Note [Two-shot pulls] in core/symm/coll/coll.go). */
    if (!symmem_coll_barrier(p, set, true))
      return;
    for (int k = 1; k < v.world; k++) {
      const int q = (v.rank + k) % v.world;
      const symmem_reduce_plan pq = symmem_plan<DT>(p, q);
      symmem_pull_slice<DT>(p.out + pq.lo * T::SIZE,
                            symmem_dev_ptr(v, q, (unsigned long long)p.out_offset + pq.lo * T::SIZE), pq, tid,
                            nthreads);
    }
  }
  /* Push publishes its stores into the peers; otherwise only reads of
   * peers' memory are left to order before their next writes: a relaxed
   * signal (see the head of this file). */
  symmem_coll_barrier(p, set, push);
}

/* ---- the low-latency path (Note [Low-latency collectives] in core/symm/coll/lowlatency.go)
 *
 * Every rank stores its contribution for peer q (all-reduce: its whole
 * input; reduce-scatter: slice q; all-gather: its input) into q's slot for
 * (parity, sender) of q's low-latency buffers, as 16-byte lines {data word,
 * flag, data word, flag}: 8 bytes of data per line, each 8-byte half one
 * store, flag = the call's sequence number + 1. The receiver polls its own
 * slots until both flags of a line are the call's: the data carries its
 * own arrival, so a call is one crossing of NVLink, with no barrier. Lines
 * of an earlier call hold an older flag; two parities (seq & 1) keep a
 * sender from overwriting lines its receiver has not read: a sender is at
 * most one call ahead of any receiver (it cannot finish call k+1 before the
 * receiver's data of call k+1, which comes after the receiver has read
 * call k). The sequence number is the channel's, in our device region
 * (SYMMEM_LL_SEQ_WORD), read by every block after symmem_pdl_wait and
 * advanced by the last block to finish (SYMMEM_LL_DONE_WORD counts them),
 * so CUDA-graph replays carry on counting. The argument agreement: thread p
 * publishes arrival << 32 | digest to peer p as symmem_coll_open does, and
 * waits for p's before any output is written (not before the data is sent:
 * the data goes to the peers' private buffers, never to their outputs). */
#define SYMMEM_LL_SEQ_WORD 4
#define SYMMEM_LL_DONE_WORD 5

/* Stores one line: 8 bytes of data (d0, d1) with the flag beside each half. */
static __device__ __forceinline__ void symmem_ll_store(char *dst, unsigned int d0, unsigned int d1,
                                                       unsigned int flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(d0), "r"(flag), "r"(d1),
               "r"(flag)
               : "memory");
}

/* Polls the line at src until both of its flags are flag; the data in d0,
 * d1. Bounded: every 256 polls it checks the abort word, the flag of a
 * mismatch and the timeout, recording (peer, set) on expiry. */
static __device__ __forceinline__ bool symmem_ll_load(const symmem_device_view &v, const char *src, unsigned int flag,
                                                      int peer, int set, unsigned int &d0, unsigned int &d1) {
  unsigned int a, b, c, d;
  unsigned long long start = 0;
  for (unsigned int spin = 1;; spin++) {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(src)
                 : "memory");
    if (b == flag && d == flag)
      break;
    if ((spin & 255) == 0) {
      unsigned long long now = symmem_dev_globaltimer();
      if (start == 0)
        start = now;
      if (symmem_dev_aborted(v, set))
        return false;
      if (now - start > (v.timeout_ns ? v.timeout_ns : SYMMEM_DEV_DEFAULT_TIMEOUT_NS)) {
        symmem_dev_fail(v, peer, set);
        return false;
      }
    }
  }
  d0 = a;
  d1 = c;
  return true;
}

/* The 8 bytes at src, or the first rem of them (rem < 8) and zeros. */
static __device__ __forceinline__ void symmem_ll_read8(const char *src, unsigned long long rem, unsigned int &d0,
                                                       unsigned int &d1) {
  if (rem >= 8) {
    const uint2 x = *(const uint2 *)src;
    d0 = x.x;
    d1 = x.y;
    return;
  }
  unsigned long long w = 0;
  for (unsigned long long i = 0; i < rem; i++)
    w |= (unsigned long long)(unsigned char)src[i] << (8 * i);
  d0 = (unsigned int)w;
  d1 = (unsigned int)(w >> 32);
}

/* Stores d0, d1 at dst: all 8 bytes, or the first rem (rem < 8). */
static __device__ __forceinline__ void symmem_ll_write8(char *dst, unsigned long long rem, unsigned int d0,
                                                        unsigned int d1) {
  if (rem >= 8) {
    *(uint2 *)dst = make_uint2(d0, d1);
    return;
  }
  const unsigned long long w = (unsigned long long)d1 << 32 | d0;
  for (unsigned long long i = 0; i < rem; i++)
    dst[i] = (char)(w >> (8 * i));
}

/* The line slot of (parity, sender) in rank r's low-latency buffers. */
static __device__ __forceinline__ char *symmem_ll_slot(const symmem_coll_params &p, int r, unsigned int parity,
                                                       int sender) {
  char *base = p.view.world <= SYMMEM_LL_DIRECT_RANKS ? p.ll_base[r] : (char *)p.view.pads[r] + p.ll_offset;
  return base + ((unsigned long long)parity * p.view.world + sender) * p.ll_slot;
}

/* Word i of our own device region, from the parameters (the region ends
 * where the low-latency buffers start, 256-byte aligned, so its start is
 * not known from them: it is read through the view unless world is small,
 * in which case the pad's start is ll_base[rank] - ll_offset). */
static __device__ __forceinline__ unsigned int *symmem_ll_region(const symmem_coll_params &p, int i) {
  if (p.view.world <= SYMMEM_LL_DIRECT_RANKS)
    return (unsigned int *)(p.ll_base[p.view.rank] - p.ll_offset + p.view.pad_size) + i;
  return symmem_dev_region(p.view, p.view.rank, i);
}

/* The start of a low-latency kernel: thread 0 loads our stop word and the
 * call's number at once (two loads in flight, one wait), then the block
 * learns both; true when the group's collectives stopped (thread 0 has
 * mirrored the stop word: symmem_coll_stop). */
static __device__ __forceinline__ bool symmem_ll_stopped_or_seq(const symmem_device_view &v, unsigned int *mirror,
                                                                int set, const unsigned int *stop_word,
                                                                const unsigned int *seq_word, unsigned int *seq) {
  __shared__ unsigned int stop_sh;
  if (threadIdx.x == 0) {
    const unsigned int st = *(volatile const unsigned int *)stop_word;
    *seq = *(volatile const unsigned int *)seq_word;
    stop_sh = st;
    if (st)
      symmem_coll_stop(v, mirror, set);
  }
  __syncthreads();
  return stop_sh != 0;
}

/* The end of a low-latency call that succeeded in every thread of the
 * block: the last block to finish advances the channel's sequence number
 * past seq (a grid of one block does it alone; the kernel's end publishes
 * it to the stream's next kernel). */
static __device__ __forceinline__ void symmem_ll_advance_words(unsigned int *seqw, unsigned int *done, unsigned int seq) {
  if (threadIdx.x != 0)
    return;
  if (gridDim.x == 1) {
    *(volatile unsigned int *)seqw = seq + 1;
    return;
  }
  __threadfence();
  if (atomicAdd(done, 1u) == gridDim.x - 1) {
    *(volatile unsigned int *)done = 0;
    *(volatile unsigned int *)seqw = seq + 1;
    __threadfence();
  }
}
static __device__ __forceinline__ void symmem_ll_advance(const symmem_coll_params &p, unsigned int seq) {
  symmem_ll_advance_words(symmem_ll_region(p, SYMMEM_LL_SEQ_WORD), symmem_ll_region(p, SYMMEM_LL_DONE_WORD), seq);
}

/* The agreement's end on the low-latency path: the agent thread of peer q
 * (if any) waits for q's arguments and compares them with ours, counting
 * q's arrival seen; true in every thread when all agree, else the group's
 * collectives stop (symmem_coll_stop) and false. */
static __device__ __forceinline__ bool symmem_ll_agreed(const symmem_device_view &v, unsigned int *mirror, int set,
                                                        bool agent, int q, unsigned int n, unsigned long long mine) {
  bool ok = true;
  if (agent) {
    ok = symmem_coll_agree(v, set, q, n, mine);
    if (ok)
      *(volatile unsigned int *)symmem_dev_set_word(v, v.rank, set, v.world + q) = n;
  }
  if (__syncthreads_and(ok))
    return true;
  if (threadIdx.x == 0)
    symmem_coll_stop(v, mirror, set);
  return false;
}

/* KIND 0 all-reduce, 1 all-gather, 2 reduce-scatter; DT and OP as the
 * reduction kernels' (unused by all-gather). count is elements (all-gather:
 * bytes, as in symmem_coll_params). */
template <int KIND, int DT, int OP> static __device__ __forceinline__ void symmem_coll_ll(const symmem_coll_params &p) {
  typedef symmem_elem<DT> T;
  const symmem_device_view &v = p.view;
  const int W = v.world, me = v.rank;
  const int set = p.set_base + blockIdx.x;
  __shared__ unsigned int seq_shared;
  const bool checked = !(p.flags & SYMMEM_COLL_UNCHECKED);
  /* Bytes this rank sends each peer (and receives from each). */
  const unsigned long long pay = KIND == 1 || KIND == 3 ? p.count : (KIND == 2 ? p.count / W : p.count) * T::SIZE;
  const unsigned long long lines = (pay + 7) / 8;
  const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
  const char *in = symmem_dev_ptr(v, me, p.in_offset + (KIND == 1 && p.sliced ? me * p.count : 0));

  /* On a group whose collectives stopped the lines and the sequence
   * numbers are out of step (a peer that gave up did not advance its
   * number, and lines of its call could pass for the next one's): no
   * line is sent or read. */
  if (symmem_ll_stopped_or_seq(v, p.stop_mirror, set, symmem_ll_region(p, SYMMEM_DEV_STOP_WORD),
                               symmem_ll_region(p, SYMMEM_LL_SEQ_WORD), &seq_shared))
    return;
  const int q = threadIdx.x;
  const bool agent = checked && q < W && q != me;
  unsigned int n = 0;
  unsigned long long mine = 0;
  if (agent) {
    n = *(volatile unsigned int *)symmem_dev_set_word(v, me, set, W + q) + 1;
    mine = symmem_coll_publish(v, set, q, n, p.digest);
  }
  __syncthreads();
  const unsigned int seq = seq_shared, flag = seq + 1, parity = seq & 1;

  /* Send: line i of our contribution for peer r into r's slot (parity, me). */
  for (unsigned long long i = tid; i < lines; i += nthreads) {
    const unsigned long long rem = pay - 8 * i;
    if (KIND == 2 || KIND == 3) {
      for (int k = 1; k < W; k++) {
        const int r = (me + k) % W;
        unsigned int d0, d1;
        symmem_ll_read8(in + r * pay + 8 * i, rem, d0, d1);
        symmem_ll_store(symmem_ll_slot(p, r, parity, me) + 16 * i, d0, d1, flag);
      }
    } else {
      unsigned int d0, d1;
      symmem_ll_read8(in + 8 * i, rem, d0, d1);
      for (int k = 1; k < W; k++) {
        const int r = (me + k) % W;
        symmem_ll_store(symmem_ll_slot(p, r, parity, me) + 16 * i, d0, d1, flag);
      }
    }
  }

  /* Every peer's arguments equal ours before any output is written. */
  if (!symmem_ll_agreed(v, p.stop_mirror, set, agent, q, n, mine))
    return;
  bool ok = true;
  /* No second look at the stop word here (the barrier kernels take one
   * after their opening barrier): every line this call reads carries its
   * flag and was stored by its peer before that peer's agreement, from the
   * peer's input of this call, so it is this call's data even if the peer
   * gave up since; a peer that stopped before sending never sends it, and
   * our poll gives up. */

  /* Receive and combine. */
  for (unsigned long long i = tid; i < lines && ok; i += nthreads) {
    const unsigned long long rem = pay - 8 * i;
    if (KIND == 1 || KIND == 3) {
      for (int k = 1; k < W && ok; k++) {
        const int r = (me + W - k) % W;
        unsigned int d0, d1;
        ok = symmem_ll_load(v, symmem_ll_slot(p, me, parity, r) + 16 * i, flag, r, set, d0, d1);
        if (ok)
          symmem_ll_write8(p.out + r * pay + 8 * i, rem, d0, d1);
      }
      char *own = p.out + me * pay + 8 * i;
      const char *mine = in + (KIND == 3 ? me * pay : 0) + 8 * i;
      if (ok && own != mine) {
        unsigned int d0, d1;
        symmem_ll_read8(mine, rem, d0, d1);
        symmem_ll_write8(own, rem, d0, d1);
      }
    } else {
      typename T::acc_t acc[T::E / 2];
      for (int r = 0; r < W && ok; r++) {
        symmem_vec16 x;
        if (r == me)
          symmem_ll_read8(in + (KIND == 2 ? me * pay : 0) + 8 * i, rem, x.w[0], x.w[1]);
        else
          ok = symmem_ll_load(v, symmem_ll_slot(p, me, parity, r) + 16 * i, flag, r, set, x.w[0], x.w[1]);
#pragma unroll
        for (int e = 0; e < T::E / 2; e++)
          acc[e] = r == 0 ? T::get(x, e) : symmem_reduce<OP>(acc[e], T::get(x, e));
      }
      if (ok) {
        symmem_vec16 y;
        y.w[0] = y.w[1] = 0;
#pragma unroll
        for (int e = 0; e < T::E / 2; e++)
          T::put(y, e, acc[e]);
        symmem_ll_write8(p.out + 8 * i, rem, y.w[0], y.w[1]);
      }
    }
  }
  if (!__syncthreads_and(ok)) {
    if (threadIdx.x == 0)
      symmem_coll_stop(v, p.stop_mirror, set);
    return;
  }
  symmem_ll_advance(p, seq);
}

#if defined(SYMMEM_MEMOPS)
/* ---- signals on a stream as one small kernel (Note [Signals as a kernel]
 * in core/symm/signal.go): what cuStreamBatchMemOp would do with the
 * stream's 32-bit writes and waits, but with programmatic dependent launch
 * and bounded waits. Thread i runs op i: a put stores value at addr with
 * release at system scope (after the previous kernel's work: the kernel
 * waits for it first); a wait polls addr with acquire until it equals
 * value (or, with SYMMEM_MEMOP_AT_LEAST, has reached it, wrap-around
 * safe), giving up after timeout_ns or when the abort word is set, and then
 * records SYMMEM_DEV_CAUSE_TIMEOUT (or the abort's cause) with the rank it
 * waited for in the error flag. The ops of one launch run at once, which
 * is what a round of a barrier needs (its puts never depend on its waits). */
/* At most 16 operations a launch (a barrier of 9 ranks, or a round of a
 * larger one): the parameters are copied at every launch, and small ones
 * launch faster. */
#define SYMMEM_MEMOPS_MAX 16
#define SYMMEM_MEMOP_WAIT 1u
#define SYMMEM_MEMOP_AT_LEAST 2u
struct symmem_memops_params {
  unsigned long long addr[SYMMEM_MEMOPS_MAX]; /* 0 */
  unsigned int value[SYMMEM_MEMOPS_MAX];      /* 128 */
  unsigned int kind[SYMMEM_MEMOPS_MAX];       /* 192: SYMMEM_MEMOP_* bits; peer << 8 */
  unsigned long long flag;                    /* 256: our error flag word */
  unsigned long long abort_word;              /* 264: our abort word */
  unsigned long long timeout_ns;              /* 272 */
  unsigned int n;                             /* 280 */
};
static_assert(sizeof(symmem_memops_params) == 288, "symmem_memops_params layout");

extern "C" __global__ void __launch_bounds__(32) symmem_memops(symmem_memops_params p) {
  symmem_pdl_wait();
  symmem_pdl_release();
  const unsigned int i = threadIdx.x;
  if (i >= p.n)
    return;
  unsigned int *a = (unsigned int *)p.addr[i];
  const unsigned int kind = p.kind[i], v = p.value[i];
  if (!(kind & SYMMEM_MEMOP_WAIT)) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
    return;
  }
  unsigned long long start = 0;
  for (unsigned int spin = 1;; spin++) {
    unsigned int cur;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(cur) : "l"(a) : "memory");
    if ((kind & SYMMEM_MEMOP_AT_LEAST) ? symmem_dev_reached(cur, v) : cur == v)
      return;
    if ((spin & 255) == 0) {
      const unsigned long long now = symmem_dev_globaltimer();
      if (start == 0)
        start = now;
      const unsigned int ab = *(volatile unsigned int *)p.abort_word;
      const unsigned int peer = kind >> 8 & 0x1fff;
      if (ab != 0 || now - start > (p.timeout_ns ? p.timeout_ns : SYMMEM_DEV_DEFAULT_TIMEOUT_NS)) {
        const unsigned int cause = ab != 0 ? SYMMEM_DEV_CAUSE_PEER_EXITED : SYMMEM_DEV_CAUSE_TIMEOUT;
        atomicCAS((unsigned int *)p.flag, 0u,
                  0x80000000u | cause << 29 | (ab != 0 ? (ab >> 16 & 0x1fff) : peer) << 16 | 0xffffu);
        return;
      }
    }
  }
}
#endif

/* One program per kernel (cuda/kernels.go compiles each at its first use):
 * with SYMMEM_A2A defined, the all-to-all; with SYMMEM_NORM_DT, the
 * all-reduce with RMSNorm of that dtype; with SYMMEM_CE_DT and SYMMEM_CE_OP,
 * the copy-engine collectives' local reduction SYMMEM_CE_NAME; with SYMMEM_COLL_DT and
 * SYMMEM_COLL_OP defined, the all-reduce and reduce-scatter kernel
 * SYMMEM_COLL_NAME of that dtype (core.DType order) and op; without them,
 * the all-gather. */
#if defined(SYMMEM_MEMOPS)
#elif defined(SYMMEM_A2A)
/* All-to-all (core/symm/coll/alltoall.go, Note [All-to-all]): every rank
 * pulls its chunks from its peers' inputs into its own out. The
 * split-driven forms store each entry of a rank's split table into the
 * exchange area of the rank it is for before the opening barrier (a
 * releasing arrival), and read their own area after it; every block does
 * both, so that no block waits for another. cuda/kernels.go packs the same
 * layout. */
struct symmem_a2a_params {
  symmem_device_view view;             /* 0 */
  unsigned long long in_offset;        /* 40: input offset in every rank's block */
  char *out;                           /* 48: this rank's out */
  unsigned long long out_rows;         /* 56: rows out holds (split-driven forms) */
  unsigned long long row_bytes;        /* 64: bytes of a row (equal splits: bytes per rank) */
  const long long *in_splits;          /* 72: S splits (the combine: then S row offsets) */
  long long *out_splits_offsets;       /* 80: 2 x S, written */
  unsigned long long exchange_offset;  /* 88: the exchange area in every pad */
  unsigned long long in_rows;          /* 96: rows the input holds */
  long long major_align;               /* 104: the dispatch's; 0: none */
  int layout;                          /* 112: -1 equal splits, 0 v, 1 2-D, 2 2-D offset */
  int experts;                         /* 116 */
  int set_base;                        /* 120 */
  unsigned int digest;                 /* 124 */
  unsigned int flags;                  /* 128 */
  unsigned int pad0;                   /* 132 */
  unsigned long long ll_offset;        /* 136: the low-latency buffers in every pad (0: not this path) */
  unsigned long long ll_slot;          /* 144: bytes of one sender's slot there */
  /* 152: rank r's pad (r < world <= SYMMEM_LL_DIRECT_RANKS; else 0): the
   * low-latency path's addresses come from the parameters rather than from
   * loads of the view's device array. */
  char *pad_base[8];
  /* 216: the pinned host word that mirrors our stop word (0: none), as
   * symmem_coll_params' (symmem_coll_stop). */
  unsigned int *stop_mirror;
};
static_assert(sizeof(symmem_a2a_params) == 224, "symmem_a2a_params layout");

#define SYMMEM_A2A_MAX_SPLITS 1024
/* Why a block refuses an all-to-all (its fail word: 1 + why << 16 | rank):
 * the ranks are a call apart, or a rank's splits or out overran. */
#define SYMMEM_A2A_FAIL_MISMATCH 1
#define SYMMEM_A2A_FAIL_OVERRUN 3
#define SYMMEM_A2A_TAG_SHIFT 48
#define SYMMEM_A2A_POISON (1ull << 47)
#define SYMMEM_A2A_VALUE (SYMMEM_A2A_POISON - 1)

/* Entry j of parity's table in rank r's pad (two 64-bit words). */
static __device__ __forceinline__ unsigned long long *symmem_a2a_entry(const symmem_a2a_params &p, int r,
                                                                      unsigned int parity, int j) {
  return (unsigned long long *)((char *)p.view.pads[r] + p.exchange_offset +
                                ((unsigned long long)parity * SYMMEM_A2A_MAX_SPLITS + j) * 16);
}

/* Exclusive prefix sum of n values by warp 0 (lane l takes a run of
 * consecutive values): out[i] = sum of in[0..i), out[n] = the total. in
 * and out may be the same shared array. Every thread calls it. */
static __device__ __forceinline__ void symmem_a2a_scan(const long long *in, long long *out, int n) {
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, per = (n + 31) / 32;
    const int lo = min(n, lane * per), hi = min(n, lo + per);
    long long sum = 0;
    for (int i = lo; i < hi; i++)
      sum += in[i];
    long long incl = sum;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      long long y = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d)
        incl += y;
    }
    long long run = incl - sum;
    const long long total = __shfl_sync(0xffffffffu, incl, 31);
    for (int i = lo; i < hi; i++) {
      long long x = in[i];
      out[i] = run;
      run += x;
    }
    if (lane == 0)
      out[n] = total;
  }
  __syncthreads();
}

/* Where piece i of rank r's output comes from: sender s and index j in
 * s's table. */
static __device__ __forceinline__ void symmem_a2a_source(const symmem_a2a_params &p, int r, int i, int &s, int &j) {
  const int W = p.view.world, E = p.experts;
  if (p.layout == 1) {
    s = i % W;
    j = r * E + i / W;
  } else if (p.layout == 2) {
    s = i / E;
    j = (i % E) * W + r;
  } else {
    s = i;
    j = r;
  }
}

/* Where entry j of rank me's table goes: rank r, as its piece i (the
 * inverse of symmem_a2a_source). */
static __device__ __forceinline__ void symmem_a2a_target(const symmem_a2a_params &p, int me, int j, int &r, int &i) {
  const int W = p.view.world, E = p.experts;
  if (p.layout == 1) {
    r = j / E;
    i = (j % E) * W + me;
  } else if (p.layout == 2) {
    r = j % W;
    i = me * E + j / W;
  } else {
    r = j;
    i = me;
  }
}

/* The most splits of the low-latency path (its tables share the kernel's
 * shared pool, ten arrays of them). */
#define SYMMEM_A2A_LL_MAX_SPLITS 256

/* Records a block's refusal (fail word f, SYMMEM_A2A_FAIL_*) in the error
 * flag, one thread: a mismatch as a mismatch (the group then stops, as
 * the other collectives' do), an overrun as cause 3 with
 * SYMMEM_DEV_OVERRUN_SET_BIT (the barriers stay balanced: the group goes
 * on). */
static __device__ __forceinline__ void symmem_a2a_refuse(const symmem_a2a_params &p, int f, int set) {
  const int why = (f - 1) >> 16, rank = (f - 1) & 0xffff;
  if (why == SYMMEM_A2A_FAIL_OVERRUN) {
    symmem_dev_fail_cause(p.view, SYMMEM_DEV_CAUSE_GAVE_UP, rank,
                          (int)(((unsigned)set & 0xfff) | SYMMEM_DEV_OVERRUN_SET_BIT));
  } else {
    symmem_dev_fail_cause(p.view, SYMMEM_DEV_CAUSE_MISMATCH, rank, set);
    symmem_coll_stop(p.view, p.stop_mirror, set);
  }
}

/* Index in rank me's table of the entry for rank r's expert e (the
 * sender's view of piece (me, e) at r). */
static __device__ __forceinline__ int symmem_a2a_entry_for(const symmem_a2a_params &p, int r, int e) {
  if (p.layout == 1)
    return r * p.experts + e;
  if (p.layout == 2)
    return e * p.view.world + r;
  return r;
}

/* Piece index at rank r of what sender s sends for r's expert e. */
static __device__ __forceinline__ int symmem_a2a_piece(const symmem_a2a_params &p, int s, int e) {
  if (p.layout == 1)
    return e * p.view.world + s;
  if (p.layout == 2)
    return s * p.experts + e;
  return s;
}

/* The line slot of (parity, sender) in rank r's low-latency buffers. */
static __device__ __forceinline__ char *symmem_a2a_ll_slot(const symmem_a2a_params &p, int r, unsigned int parity,
                                                           int sender) {
  char *pad = p.view.world <= SYMMEM_LL_DIRECT_RANKS ? p.pad_base[r] : (char *)p.view.pads[r];
  return pad + p.ll_offset + ((unsigned long long)parity * p.view.world + sender) * p.ll_slot;
}

/* Word i of our own device region, from the parameters where they hold
 * the pads. */
static __device__ __forceinline__ unsigned int *symmem_a2a_region(const symmem_a2a_params &p, int i) {
  if (p.view.world <= SYMMEM_LL_DIRECT_RANKS)
    return (unsigned int *)(p.pad_base[p.view.rank] + p.view.pad_size) + i;
  return symmem_dev_region(p.view, p.view.rank, i);
}

/* The split-driven forms on the low-latency buffers (Note [All-to-all]):
 * one crossing, no barrier. Sender s's slot in rank r holds, as the
 * low-latency path's lines (8 bytes of data, the call's flag beside each
 * half), E header lines (the rows s sends for each of r's experts; bit 31
 * of the high word says s's table is bad, bit 30 that its rows for r would
 * pass r's slot) and then each piece's rows, packed from
 * line E on, each piece starting at a line. The host takes this path only
 * when out holds at most the slot's data less 16 bytes per expert, so that
 * whatever a rank may receive fits its slots; a sender whose rows for r
 * would not fit sends r poisoned headers, as r overruns out anyway. Our
 * own pieces are copied from our input. The call's number is the
 * low-latency path's (words 4 and 5), which these calls share with the
 * other low-latency collectives of channel 0; the argument agreement is
 * theirs. */
static __device__ __noinline__ void symmem_a2a_ll(const symmem_a2a_params &p, long long *pool, int *fail) {
  const symmem_device_view &v = p.view;
  const int W = v.world, me = v.rank, E = p.experts, S = W * E;
  const int set = p.set_base + blockIdx.x;
  const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
  const unsigned long long rb = p.row_bytes, slot_lines = p.ll_slot / 16;
  const int M = SYMMEM_A2A_LL_MAX_SPLITS + 1;
  /* By our table's entry j: splits, source rows, first line in the
   * receiver's slot; by piece i: splits received, their first line in the
   * sender's slot, out rows (raw prefix, then with the alignment). */
  long long *t_split = pool, *t_src = pool + M, *t_line = pool + 2 * M;
  long long *r_split = pool + 3 * M, *r_line = pool + 4 * M, *r_raw = pool + 5 * M, *r_off = pool + 6 * M,
            *r_at = pool + 7 * M;
  __shared__ unsigned int seq_sh, over_sh;
  const bool checked = !(p.flags & SYMMEM_COLL_UNCHECKED);
  /* A stopped group's lines and numbers are out of step: nothing is sent
   * or read (as the low-latency collectives). */
  if (threadIdx.x == 0) {
    over_sh = 0;
    *fail = 0;
  }
  if (symmem_ll_stopped_or_seq(v, p.stop_mirror, set, symmem_a2a_region(p, SYMMEM_DEV_STOP_WORD),
                               symmem_a2a_region(p, 4), &seq_sh))
    return;
  const int q = threadIdx.x;
  const bool agent = checked && q < W && q != me;
  unsigned int n = 0;
  unsigned long long mine = 0;
  if (agent) {
    n = *(volatile unsigned int *)symmem_dev_set_word(v, me, set, W + q) + 1;
    mine = symmem_coll_publish(v, set, q, n, p.digest);
  }
  for (int j = threadIdx.x; j < S; j += blockDim.x)
    t_split[j] = p.in_splits[j];
  if (p.layout != 2)
    symmem_a2a_scan(t_split, t_src, S);
  else
    for (int j = threadIdx.x; j < S; j += blockDim.x)
      t_src[j] = p.in_splits[S + j];
  __syncthreads();
  const unsigned int seq = seq_sh, flag = seq + 1, parity = seq & 1;
  bool bad = false;
  for (int j = threadIdx.x; j < S; j += blockDim.x) {
    long long k = t_split[j], off = t_src[j];
    if (k < 0 || off < 0 || (k > 0 && ((unsigned long long)k > p.in_rows || (unsigned long long)off > p.in_rows - k)))
      bad = true;
  }
  const bool poison = __syncthreads_or(bad);
  /* Lines of each destination's pieces (thread r for destination r); a
   * destination whose lines pass its slot is poisoned (bit r of over_sh). */
  if (threadIdx.x < W) {
    const int r = threadIdx.x;
    unsigned long long at = E;
    for (int e = 0; e < E; e++) {
      const int j = symmem_a2a_entry_for(p, r, e);
      t_line[j] = (long long)at;
      at += ((unsigned long long)t_split[j] * rb + 7) / 8;
    }
    if (at > slot_lines)
      atomicOr(&over_sh, 1u << r);
  }
  __syncthreads();
  /* Send: headers, then rows, to every peer. */
  for (int k = 1; k < W; k++) {
    const int r = (me + k) % W;
    const bool over = over_sh >> r & 1, off = poison || over;
    char *slot = symmem_a2a_ll_slot(p, r, parity, me);
    for (int e = tid; e < E; e += nthreads) {
      const unsigned long long x = (unsigned long long)t_split[symmem_a2a_entry_for(p, r, e)];
      const unsigned int mark = poison ? 0x80000000u : (over ? 0x40000000u : 0);
      symmem_ll_store(slot + 16 * e, (unsigned int)x, ((unsigned int)(x >> 32) & 0x3fffffffu) | mark, flag);
    }
    if (off)
      continue;
    for (int e = 0; e < E; e++) {
      const int j = symmem_a2a_entry_for(p, r, e);
      const unsigned long long bytes = (unsigned long long)t_split[j] * rb, lines = (bytes + 7) / 8;
      const char *src = symmem_dev_ptr(v, me, p.in_offset + (unsigned long long)t_src[j] * rb);
      char *dst = slot + 16 * (unsigned long long)t_line[j];
      for (unsigned long long l = (tid + nthreads - (unsigned long long)t_line[j] % nthreads) % nthreads; l < lines;
           l += nthreads) {
        unsigned int d0, d1;
        symmem_ll_read8(src + 8 * l, bytes - 8 * l, d0, d1);
        symmem_ll_store(dst + 16 * l, d0, d1, flag);
      }
    }
  }
  /* Every peer's arguments equal ours before any output is written. */
  if (!symmem_ll_agreed(v, p.stop_mirror, set, agent, q, n, mine))
    return;
  bool ok = true;
  /* Headers: what every piece brings. */
  for (int i = threadIdx.x; i < S && ok; i += blockDim.x) {
    int s, j;
    symmem_a2a_source(p, me, i, s, j);
    if (s == me) {
      r_split[i] = poison ? 0 : t_split[j];
      if (poison)
        atomicCAS(fail, 0, 1 + (SYMMEM_A2A_FAIL_OVERRUN << 16 | me));
      continue;
    }
    const int e = p.layout == 1 ? i / W : (p.layout == 2 ? i % E : 0);
    unsigned int d0, d1;
    ok = symmem_ll_load(v, symmem_a2a_ll_slot(p, me, parity, s) + 16 * e, flag, s, set, d0, d1);
    if (ok && (d1 & 0xc0000000u)) {
      /* The sender's table was bad (bit 31: it is named), or what it
       * sends us passes our slot, and so our out (bit 30: we are). */
      atomicCAS(fail, 0, 1 + (SYMMEM_A2A_FAIL_OVERRUN << 16 | (d1 & 0x80000000u ? s : me)));
      d0 = d1 = 0;
    }
    r_split[i] = (long long)((unsigned long long)(d1 & 0x3fffffffu) << 32 | d0);
  }
  if (!__syncthreads_and(ok)) {
    if (threadIdx.x == 0)
      symmem_coll_stop(v, p.stop_mirror, set);
    return;
  }
  if (*fail)
    for (int i = threadIdx.x; i < S; i += blockDim.x)
      r_split[i] = 0;
  /* Where each piece starts in its sender's slot (thread s for sender s). */
  if (threadIdx.x < W) {
    const int s = threadIdx.x;
    unsigned long long at = E;
    for (int e = 0; e < E; e++) {
      const int i = symmem_a2a_piece(p, s, e);
      r_line[i] = (long long)at;
      at += ((unsigned long long)r_split[i] * rb + 7) / 8;
    }
  }
  /* Out rows, as the barrier path lays them out. */
  symmem_a2a_scan(r_split, r_raw, S);
  const int tile = p.layout == 1 ? W : S, ntiles = S / tile;
  if (p.major_align > 0) {
    for (int t = threadIdx.x; t < ntiles; t += blockDim.x) {
      long long len = r_raw[(t + 1) * tile] - r_raw[t * tile];
      len = (len + p.major_align - 1) / p.major_align * p.major_align;
      r_off[t] = len < p.major_align ? p.major_align : len;
    }
    symmem_a2a_scan(r_off, r_off, ntiles);
  }
  __syncthreads();
  const long long total = p.major_align > 0 ? r_off[ntiles] : r_raw[S];
  for (int i = threadIdx.x; i < S; i += blockDim.x) {
    const int t = i / tile;
    r_at[i] = (p.major_align > 0 ? r_off[t] - r_raw[t * tile] : 0) + r_raw[i];
  }
  if (threadIdx.x == 0 && !*fail && (unsigned long long)total > p.out_rows)
    *fail = 1 + (SYMMEM_A2A_FAIL_OVERRUN << 16 | me);
  __syncthreads();
  if (blockIdx.x == 0)
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
      p.out_splits_offsets[i] = r_split[i];
      p.out_splits_offsets[S + i] = r_at[i];
    }
  if (*fail) {
    if (threadIdx.x == 0)
      symmem_a2a_refuse(p, *fail, set);
  } else {
    /* Rows: from the peers' lines, and our own from our input. */
    for (int i = 0; i < S && ok; i++) {
      int s, j;
      symmem_a2a_source(p, me, i, s, j);
      const unsigned long long bytes = (unsigned long long)r_split[i] * rb, lines = (bytes + 7) / 8;
      char *dst = p.out + (unsigned long long)r_at[i] * rb;
      const unsigned long long first = (unsigned long long)r_raw[i] * rb / 8 % nthreads;
      const char *slot = s == me ? 0 : symmem_a2a_ll_slot(p, me, parity, s) + 16 * (unsigned long long)r_line[i];
      const char *src = s == me ? symmem_dev_ptr(v, me, p.in_offset + (unsigned long long)t_src[j] * rb) : 0;
      for (unsigned long long l = (tid + nthreads - first) % nthreads; l < lines && ok; l += nthreads) {
        unsigned int d0, d1;
        if (s == me)
          symmem_ll_read8(src + 8 * l, bytes - 8 * l, d0, d1);
        else
          ok = symmem_ll_load(v, slot + 16 * l, flag, s, set, d0, d1);
        if (ok)
          symmem_ll_write8(dst + 8 * l, bytes - 8 * l, d0, d1);
      }
    }
  }
  if (!__syncthreads_and(ok)) {
    if (threadIdx.x == 0)
      symmem_coll_stop(v, p.stop_mirror, set);
    return;
  }
  /* The last block to finish advances the call number (words 4, 5). */
  symmem_ll_advance_words(symmem_a2a_region(p, SYMMEM_LL_SEQ_WORD), symmem_a2a_region(p, SYMMEM_LL_DONE_WORD), seq);
}

extern "C" __global__ void __launch_bounds__(SYMMEM_COLL_THREADS) symmem_all_to_all(const symmem_a2a_params p) {
  symmem_pdl_wait();
  symmem_pdl_release();
  const symmem_device_view &v = p.view;
  const int W = v.world, me = v.rank, set = p.set_base + blockIdx.x;
  const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
  unsigned int *const seq_word = symmem_dev_region(v, me, 6);
  const unsigned int seq = *(volatile unsigned int *)seq_word;
  const unsigned int parity = seq & 1;
  const unsigned long long tag = (unsigned long long)(seq & 0xffff) << SYMMEM_A2A_TAG_SHIFT;
  const bool split_driven = p.layout >= 0;
  const int S = split_driven ? W * p.experts : W;
  /* By output piece i: rows received, source row, out row; raw[i] the
   * exclusive prefix of the received rows (raw[S] their total). */
  __shared__ long long s_pool[5 * (SYMMEM_A2A_MAX_SPLITS + 1)];
  __shared__ int s_fail; /* 0, or 1 + cause << 16 | rank */
  if (p.ll_slot != 0) {
    symmem_a2a_ll(p, s_pool, &s_fail);
    return;
  }
  long long *const s_split = s_pool, *const s_src = s_pool + (SYMMEM_A2A_MAX_SPLITS + 1);
  long long *const s_off = s_pool + 2 * (SYMMEM_A2A_MAX_SPLITS + 1), *const s_raw = s_pool + 3 * (SYMMEM_A2A_MAX_SPLITS + 1);
  long long *const s_at = s_pool + 4 * (SYMMEM_A2A_MAX_SPLITS + 1);
  bool ok = true;
  if (threadIdx.x == 0)
    s_fail = 0;
  if (split_driven) {
    /* Our table: splits, their source rows (the prefix sum, or given),
     * validated; any bad entry poisons all. */
    for (int j = threadIdx.x; j < S; j += blockDim.x)
      s_split[j] = p.in_splits[j];
    if (p.layout != 2)
      symmem_a2a_scan(s_split, s_src, S);
    else
      for (int j = threadIdx.x; j < S; j += blockDim.x)
        s_src[j] = p.in_splits[S + j];
    __syncthreads();
    bool bad = false;
    for (int j = threadIdx.x; j < S; j += blockDim.x) {
      long long n = s_split[j], off = s_src[j];
      if (n < 0 || off < 0 || (n > 0 && ((unsigned long long)n > p.in_rows || (unsigned long long)off > p.in_rows - n)))
        bad = true;
    }
    const unsigned long long poison = __syncthreads_or(bad) ? SYMMEM_A2A_POISON : 0;
    /* Entry j goes to the rank it is for, as that rank's piece i. */
    for (int j = threadIdx.x; j < S; j += blockDim.x) {
      int r, i;
      symmem_a2a_target(p, me, j, r, i);
      unsigned long long *e = symmem_a2a_entry(p, r, parity, i);
      asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(e),
                   "l"(tag | poison | ((unsigned long long)s_split[j] & SYMMEM_A2A_VALUE))
                   : "memory");
      asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(e + 1),
                   "l"(tag | poison | ((unsigned long long)s_src[j] & SYMMEM_A2A_VALUE))
                   : "memory");
    }
    ok = symmem_coll_open(p, set, true); /* the tables above go with the arrivals */
  } else {
    ok = symmem_coll_open(p, set);
  }
  if (!ok)
    goto done;
  if (split_driven) {
    /* What we receive, in output order: the entries the peers stored in
     * our own pad. */
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
      int s, j;
      symmem_a2a_source(p, me, i, s, j);
      const unsigned long long *e = symmem_a2a_entry(p, me, parity, i);
      unsigned long long w0, w1;
      asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(w0) : "l"(e) : "memory");
      asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(w1) : "l"(e + 1) : "memory");
      const unsigned long long hi = ~(SYMMEM_A2A_POISON | SYMMEM_A2A_VALUE);
      if ((w0 & hi) != tag || (w1 & hi) != tag)
        atomicCAS(&s_fail, 0, 1 + (SYMMEM_A2A_FAIL_MISMATCH << 16 | s));
      else if (w0 & SYMMEM_A2A_POISON)
        atomicCAS(&s_fail, 0, 1 + (SYMMEM_A2A_FAIL_OVERRUN << 16 | s));
      s_split[i] = (long long)(w0 & SYMMEM_A2A_VALUE);
      s_src[i] = (long long)(w1 & SYMMEM_A2A_VALUE);
    }
    __syncthreads();
    if (s_fail) {
      for (int i = threadIdx.x; i < S; i += blockDim.x)
        s_split[i] = 0;
    }
    /* Out rows: the exclusive prefix, by groups (the dispatch: one per
     * expert, W pieces each, each group aligned up to major_align and
     * never empty). */
    symmem_a2a_scan(s_split, s_raw, S);
    const int tile = p.layout == 1 ? W : S, ntiles = S / tile;
    if (p.major_align > 0) {
      /* s_off[t]: group t's aligned length, then its start. */
      for (int t = threadIdx.x; t < ntiles; t += blockDim.x) {
        long long len = s_raw[(t + 1) * tile] - s_raw[t * tile];
        len = (len + p.major_align - 1) / p.major_align * p.major_align;
        s_off[t] = len < p.major_align ? p.major_align : len;
      }
      symmem_a2a_scan(s_off, s_off, ntiles); /* group starts; s_off[ntiles] the total */
    }
    __syncthreads();
    long long total = p.major_align > 0 ? s_off[ntiles] : s_raw[S];
    /* Offsets of piece i: group start + rows before it in its group. */
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
      int t = i / tile;
      s_at[i] = (p.major_align > 0 ? s_off[t] : 0) + s_raw[i] - (p.major_align > 0 ? s_raw[t * tile] : 0);
    }
    __syncthreads();
    if (!s_fail && (unsigned long long)total > p.out_rows && threadIdx.x == 0)
      s_fail = 1 + (SYMMEM_A2A_FAIL_OVERRUN << 16 | me);
    __syncthreads();
    if (blockIdx.x == 0)
      for (int i = threadIdx.x; i < S; i += blockDim.x) {
        p.out_splits_offsets[i] = s_split[i];
        p.out_splits_offsets[S + i] = s_at[i];
      }
    if (s_fail) {
      if (threadIdx.x == 0)
        symmem_a2a_refuse(p, s_fail, set);
    } else {
      /* The rows, spread over the whole grid: the vectors of piece i are
       * numbered on from the pieces before it, vector k going to thread
       * k % nthreads, so that small pieces do not all fall on thread 0. */
      const unsigned long long rb = p.row_bytes;
      const bool vec = ((rb | p.in_offset | (unsigned long long)p.out) & 15) == 0;
      for (int k = 0; k < S; k++) {
        /* Blocks start at different pieces, so that the local copy and
         * the pulls from every peer run at once. */
        const int i = (k + blockIdx.x) % S;
        const unsigned long long n = (unsigned long long)s_split[i] * rb;
        if (n == 0)
          continue;
        int s, j;
        symmem_a2a_source(p, me, i, s, j);
        const char *src = symmem_dev_ptr(v, s, p.in_offset + (unsigned long long)s_src[i] * rb);
        char *dst = p.out + (unsigned long long)s_at[i] * rb;
        if (!vec) {
          symmem_dev_copy(dst, src, n, tid, nthreads);
          continue;
        }
        const unsigned long long nv = n / 16, first = (unsigned long long)s_raw[i] * rb / 16 % nthreads;
        unsigned long long k0 = (tid + nthreads - first) % nthreads;
        for (; k0 < nv; k0 += SYMMEM_COLL_UNROLL * nthreads) {
          symmem_vec16 x[SYMMEM_COLL_UNROLL];
#pragma unroll
          for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
            if (k0 + u * nthreads < nv)
              x[u] = symmem_dev_load16(src + 16 * (k0 + u * nthreads));
#pragma unroll
          for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
            if (k0 + u * nthreads < nv)
              symmem_dev_store16(dst + 16 * (k0 + u * nthreads), x[u]);
        }
      }
    }
  } else {
    /* Equal splits: row_bytes bytes from every rank, our chunk of its
     * input, rank s's at s * row_bytes of out. */
    const unsigned long long n = p.row_bytes;
    const bool vec = ((n | p.in_offset | (unsigned long long)p.out) & 15) == 0;
    for (int k = 0; k < W; k++) {
      const int s = (me + k + blockIdx.x) % W;
      const char *src = symmem_dev_ptr(v, s, p.in_offset + (unsigned long long)me * n);
      char *dst = p.out + (unsigned long long)s * n;
      if (!vec) {
        symmem_dev_copy(dst, src, n, tid, nthreads);
        continue;
      }
      const unsigned long long nv = n / 16, first = (unsigned long long)s * nv % nthreads;
      for (unsigned long long k0 = (tid + nthreads - first) % nthreads; k0 < nv; k0 += SYMMEM_COLL_UNROLL * nthreads) {
        symmem_vec16 x[SYMMEM_COLL_UNROLL];
#pragma unroll
        for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
          if (k0 + u * nthreads < nv)
            x[u] = symmem_dev_load16(src + 16 * (k0 + u * nthreads));
#pragma unroll
        for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
          if (k0 + u * nthreads < nv)
            symmem_dev_store16(dst + 16 * (k0 + u * nthreads), x[u]);
      }
    }
  }
  /* Pulls only: the peers need our reads done (of their inputs and
   * tables), not our stores. */
  symmem_coll_barrier(p, set, false);
done:
  /* The last block to finish advances the call number (word 6). */
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned int *finished = symmem_dev_region(v, me, 7);
    if (atomicAdd(finished, 1u) == gridDim.x - 1) {
      *(volatile unsigned int *)finished = 0;
      __threadfence();
      *(volatile unsigned int *)seq_word = seq + 1;
    }
  }
}
#elif defined(SYMMEM_NORM_DT)
/* ---- all-reduce with RMSNorm (Note [All-reduce with RMSNorm] in
 * core/symm/coll/norm.go), one program per dtype, SYMMEM_NORM_NAME. A block
 * of SYMMEM_NORM_THREADS threads owns whole rows (blockIdx.x, then every
 * gridDim.x-th); thread j works on octets (8 elements) j, j + 256, ... of a
 * row and holds partial sum j of its squares. c.algo 4: the fused call on
 * the low-latency path (the all-reduce's lines, as symmem_coll_ll's, then
 * the add and the norm in the same kernel); otherwise c.out holds the
 * all-reduce's result and the kernel adds and norms alone. Every product
 * and sum is an explicitly rounded fp32 operation (no contraction into
 * FMAs), division and square root are IEEE's: the host backend computes
 * the same bits. cuda/kernels.go packs the same layout. */
struct symmem_norm_params {
  symmem_coll_params c;       /* 0: the all-reduce (count = tokens * hidden) */
  char *residual;             /* 192 */
  const char *weight;         /* 200 */
  unsigned long long tokens;  /* 208 */
  unsigned long long hidden;  /* 216: a multiple of 8 */
  float eps;                  /* 224 */
  unsigned int pad0;          /* 228 */
};
static_assert(sizeof(symmem_norm_params) == 232, "symmem_norm_params layout");
#define SYMMEM_NORM_THREADS 256

typedef symmem_elem<SYMMEM_NORM_DT> symmem_norm_t;
/* Bytes of an octet, and its 16-byte vectors. */
#define SYMMEM_NORM_OCTET (8 * symmem_norm_t::SIZE)
#define SYMMEM_NORM_VECS (SYMMEM_NORM_OCTET / 16)

static __device__ __forceinline__ void symmem_norm_widen(const symmem_vec16 *q, float *x) {
#pragma unroll
  for (int v = 0; v < SYMMEM_NORM_VECS; v++)
#pragma unroll
    for (int k = 0; k < symmem_norm_t::E; k++)
      x[v * symmem_norm_t::E + k] = symmem_norm_t::get(q[v], k);
}

/* The octet at src, widened. */
static __device__ __forceinline__ void symmem_norm_load(const char *src, float *x) {
  symmem_vec16 q[SYMMEM_NORM_VECS];
#pragma unroll
  for (int v = 0; v < SYMMEM_NORM_VECS; v++)
    q[v] = symmem_dev_load16(src + 16 * v);
  symmem_norm_widen(q, x);
}

/* x rounded to the dtype (x takes the rounded values), into q. */
static __device__ __forceinline__ void symmem_norm_round(float *x, symmem_vec16 *q) {
#pragma unroll
  for (int v = 0; v < SYMMEM_NORM_VECS; v++) {
    q[v].w[0] = q[v].w[1] = q[v].w[2] = q[v].w[3] = 0;
#pragma unroll
    for (int k = 0; k < symmem_norm_t::E; k++)
      symmem_norm_t::put(q[v], k, x[v * symmem_norm_t::E + k]);
  }
  symmem_norm_widen(q, x);
}

/* x rounded to the dtype and stored as the octet at dst. */
static __device__ __forceinline__ void symmem_norm_store(char *dst, float *x) {
  symmem_vec16 q[SYMMEM_NORM_VECS];
  symmem_norm_round(x, q);
#pragma unroll
  for (int v = 0; v < SYMMEM_NORM_VECS; v++)
    symmem_dev_store16(dst + 16 * v, q[v]);
}

/* The add of one octet: a (the all-reduce's values, rounded) plus the
 * residual octet at res, rounded and stored there; returns part plus the
 * squares of the stored values, in element order. */
static __device__ __forceinline__ float symmem_norm_add(char *res, float *a, float part) {
  float r[8];
  symmem_norm_load(res, r);
#pragma unroll
  for (int k = 0; k < 8; k++)
    a[k] = __fadd_rn(a[k], r[k]);
  symmem_norm_store(res, a);
#pragma unroll
  for (int k = 0; k < 8; k++)
    part = __fadd_rn(part, __fmul_rn(a[k], a[k]));
  return part;
}

/* 1 / sqrt(ss / hidden + eps) of the row whose partial sum j thread j
 * holds (the tree of Note [All-reduce with RMSNorm]); every thread of the
 * block calls it. */
static __device__ __forceinline__ float symmem_norm_inv(float part, float *parts, unsigned long long hidden, float eps) {
  parts[threadIdx.x] = part;
  __syncthreads();
#pragma unroll
  for (int s = SYMMEM_NORM_THREADS / 2; s >= 1; s >>= 1) {
    if (threadIdx.x < s)
      parts[threadIdx.x] = __fadd_rn(parts[threadIdx.x], parts[threadIdx.x + s]);
    __syncthreads();
  }
  const float ss = parts[0];
  __syncthreads(); /* parts is the next row's */
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)hidden), eps)));
}

/* The row's out: (residual * inv) * weight, rounded, for this thread's
 * octets (whose residual this thread stored). */
static __device__ __forceinline__ void symmem_norm_out(const symmem_norm_params &p, char *out, const char *res,
                                                       float inv) {
  for (unsigned long long o = threadIdx.x; o < p.hidden / 8; o += SYMMEM_NORM_THREADS) {
    float r[8], g[8];
    symmem_norm_load(res + o * SYMMEM_NORM_OCTET, r);
    symmem_norm_load(p.weight + o * SYMMEM_NORM_OCTET, g);
#pragma unroll
    for (int k = 0; k < 8; k++)
      r[k] = __fmul_rn(__fmul_rn(r[k], inv), g[k]);
    symmem_norm_store(out + o * SYMMEM_NORM_OCTET, r);
  }
}

extern "C" __global__ void __launch_bounds__(SYMMEM_NORM_THREADS) SYMMEM_NORM_NAME(const symmem_norm_params p) {
  symmem_pdl_wait();
  symmem_pdl_release();
  __shared__ float parts[SYMMEM_NORM_THREADS];
  const symmem_coll_params &c = p.c;
  const unsigned long long row = p.hidden * symmem_norm_t::SIZE, octets = p.hidden / 8;
  if (c.algo != SYMMEM_COLL_ALGO_LL) {
    for (unsigned long long t = blockIdx.x; t < p.tokens; t += gridDim.x) {
      char *res = p.residual + t * row, *out = c.out + t * row;
      float part = 0.0f;
      for (unsigned long long o = threadIdx.x; o < octets; o += SYMMEM_NORM_THREADS) {
        float a[8];
        symmem_norm_load(out + o * SYMMEM_NORM_OCTET, a);
        part = symmem_norm_add(res + o * SYMMEM_NORM_OCTET, a, part);
      }
      symmem_norm_out(p, out, res, symmem_norm_inv(part, parts, p.hidden, p.eps));
    }
    return;
  }

  /* The fused call: the protocol of symmem_coll_ll (its lines, parity,
   * call counter and argument agreement), with the lines of row t sent and
   * received by the block that owns row t. */
  const symmem_device_view &v = c.view;
  const int W = v.world, me = v.rank;
  const int set = c.set_base + blockIdx.x;
  __shared__ unsigned int seq_shared;
  const char *in = symmem_dev_ptr(v, me, c.in_offset);
  const unsigned long long row_lines = row / 8;
  /* A stopped group's lines and numbers are out of step: nothing is sent or
   * read (as symmem_coll_ll). */
  if (symmem_ll_stopped_or_seq(v, c.stop_mirror, set, symmem_ll_region(c, SYMMEM_DEV_STOP_WORD),
                               symmem_ll_region(c, SYMMEM_LL_SEQ_WORD), &seq_shared))
    return;
  const int q = threadIdx.x;
  const bool agent = !(c.flags & SYMMEM_COLL_UNCHECKED) && q < W && q != me;
  unsigned int n = 0;
  unsigned long long mine = 0;
  if (agent) {
    n = *(volatile unsigned int *)symmem_dev_set_word(v, me, set, W + q) + 1;
    mine = symmem_coll_publish(v, set, q, n, c.digest);
  }
  __syncthreads();
  const unsigned int seq = seq_shared, flag = seq + 1, parity = seq & 1;

  /* Send: line i of our input (bytes [8i, 8i + 8)) into every peer's slot
   * (parity, me) at 16i, for the lines of our rows. */
  for (unsigned long long t = blockIdx.x; t < p.tokens; t += gridDim.x)
    for (unsigned long long j = threadIdx.x; j < row_lines; j += SYMMEM_NORM_THREADS) {
      const unsigned long long i = t * row_lines + j;
      const uint2 x = *(const uint2 *)(in + 8 * i);
      for (int k = 1; k < W; k++)
        symmem_ll_store(symmem_ll_slot(c, (me + k) % W, parity, me) + 16 * i, x.x, x.y, flag);
    }

  /* Every peer's arguments equal ours before any output is written. */
  if (!symmem_ll_agreed(v, c.stop_mirror, set, agent, q, n, mine))
    return;
  bool ok = true;

  /* Receive each octet from every rank, reduce in rank order, round, add,
   * norm. */
  for (unsigned long long t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    char *res = p.residual + t * row, *out = c.out + t * row;
    float part = 0.0f;
    for (unsigned long long o = threadIdx.x; o < octets && ok; o += SYMMEM_NORM_THREADS) {
      const unsigned long long line0 = (t * row + o * SYMMEM_NORM_OCTET) / 8;
      float acc[8];
      for (int r = 0; r < W && ok; r++) {
        float x[8];
        if (r == me) {
          symmem_norm_load(in + 8 * line0, x);
        } else {
          symmem_vec16 qv[SYMMEM_NORM_VECS];
          const char *src = symmem_ll_slot(c, me, parity, r) + 16 * line0;
#pragma unroll
          for (int l = 0; l < 2 * SYMMEM_NORM_VECS; l++)
            if (ok)
              ok = symmem_ll_load(v, src + 16 * l, flag, r, set, qv[l / 2].w[2 * (l & 1)],
                                  qv[l / 2].w[2 * (l & 1) + 1]);
          symmem_norm_widen(qv, x);
        }
#pragma unroll
        for (int k = 0; k < 8; k++)
          acc[k] = r == 0 ? x[k] : __fadd_rn(acc[k], x[k]);
      }
      if (ok) {
        symmem_vec16 qa[SYMMEM_NORM_VECS];
        symmem_norm_round(acc, qa);
        part = symmem_norm_add(res + o * SYMMEM_NORM_OCTET, acc, part);
      }
    }
    if (!__syncthreads_and(ok)) {
      if (threadIdx.x == 0)
        symmem_coll_stop(v, c.stop_mirror, set);
      return;
    }
    symmem_norm_out(p, out, res, symmem_norm_inv(part, parts, p.hidden, p.eps));
  }
  symmem_ll_advance(c, seq);
}
#elif defined(SYMMEM_CE_DT)
/* The copy-engine all-reduce's and reduce-scatter's reduction
 * (core/symm/coll/copyengine.go, Note [Copy-engine collectives]): the copy
 * engines have pulled the peers' chunks into this rank's scratch; out gets
 * the reduction of count elements at each of src[0..nsrc), in that order
 * (rank order), accumulated as the collectives do (fp32 for 16-bit types,
 * rounded once). Only this rank's memory is touched: no barrier, no pad.
 * A grid-stride loop over 16-byte vectors where every pointer is aligned,
 * element by element otherwise and for the tail. cuda/copyengine.go packs
 * the same layout. */
#define SYMMEM_CE_MAX_SRCS 64
struct symmem_ce_reduce_params {
  const char *src[SYMMEM_CE_MAX_SRCS]; /* 0 */
  char *out;                           /* 512 */
  unsigned long long count;            /* 520: elements */
  unsigned int nsrc;                   /* 528 */
  unsigned int pad0;                   /* 532 */
};
static_assert(sizeof(symmem_ce_reduce_params) == 536, "symmem_ce_reduce_params layout");

extern "C" __global__ void __launch_bounds__(SYMMEM_COLL_THREADS) SYMMEM_CE_NAME(const symmem_ce_reduce_params p) {
  typedef symmem_elem<SYMMEM_CE_DT> T;
  typedef typename T::acc_t A;
  const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long bits = (unsigned long long)p.out;
  for (unsigned int q = 0; q < p.nsrc; q++)
    bits |= (unsigned long long)p.src[q];
  const unsigned long long nv = (bits & 15) == 0 ? p.count / T::E : 0;
  for (unsigned long long i = tid; i < nv; i += nthreads) {
    A acc[T::E];
    for (unsigned int q = 0; q < p.nsrc; q++) {
      const symmem_vec16 x = symmem_dev_load16(p.src[q] + 16 * i);
#pragma unroll
      for (int k = 0; k < T::E; k++)
        acc[k] = q == 0 ? T::get(x, k) : symmem_reduce<SYMMEM_CE_OP>(acc[k], T::get(x, k));
    }
    symmem_vec16 r = {};
#pragma unroll
    for (int k = 0; k < T::E; k++)
      T::put(r, k, acc[k]);
    symmem_dev_store16(p.out + 16 * i, r);
  }
  for (unsigned long long e = nv * T::E + tid; e < p.count; e += nthreads) {
    A acc = T::load1(p.src[0] + e * T::SIZE);
    for (unsigned int q = 1; q < p.nsrc; q++)
      acc = symmem_reduce<SYMMEM_CE_OP>(acc, T::load1(p.src[q] + e * T::SIZE));
    T::store1(p.out + e * T::SIZE, acc);
  }
}
#elif defined(SYMMEM_COLL_DT)
extern "C" __global__ void __launch_bounds__(SYMMEM_COLL_THREADS) SYMMEM_COLL_NAME(symmem_coll_params p) {
  symmem_pdl_wait();
  symmem_pdl_release();
  if (p.algo == SYMMEM_COLL_ALGO_LL) {
    if (p.kind == 2)
      symmem_coll_ll<2, SYMMEM_COLL_DT, SYMMEM_COLL_OP>(p);
    else
      symmem_coll_ll<0, SYMMEM_COLL_DT, SYMMEM_COLL_OP>(p);
    return;
  }
  symmem_coll_reduce<SYMMEM_COLL_DT, SYMMEM_COLL_OP>(p);
}
#else
/* All-gather: count is bytes here. Rank q's input (at in_offset of its
 * block, or at in_offset + q*count when sliced) goes to out + q*count; in
 * place (out + rank*count is our input) our own part is not copied. */
extern "C" __global__ void __launch_bounds__(SYMMEM_COLL_THREADS) symmem_all_gather(symmem_coll_params p) {
  symmem_pdl_wait();
  symmem_pdl_release();
  if (p.algo == SYMMEM_COLL_ALGO_LL) {
    /* The all-to-all's small calls ride here too (kind 3): chunk r of our
     * input to rank r, chunk r's lines from rank r to out + r*count. */
    if (p.kind == 3)
      symmem_coll_ll<3, 3, 0>(p);
    else
      symmem_coll_ll<1, 3, 0>(p);
    return;
  }
  const symmem_device_view &v = p.view;
  const int set = p.set_base + blockIdx.x;
  const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
  if (!symmem_coll_open(p, set))
    return;
  const unsigned long long nvec = p.count / 16, total = nvec * v.world;
  if ((p.count & 15) == 0 && total <= SYMMEM_COLL_UNROLL * nthreads) {
    /* Small, whole vectors: one pass over every rank's input at once (item
     * j is vector j % nvec of rank j / nvec), each thread's loads in flight
     * together before its stores: one round trip to the peers per call
     * rather than one per rank. In place, our own part is not copied. */
    symmem_vec16 xs[SYMMEM_COLL_UNROLL];
    char *dsts[SYMMEM_COLL_UNROLL];
#pragma unroll
    for (int u = 0; u < SYMMEM_COLL_UNROLL; u++) {
      unsigned long long j = tid + u * nthreads;
      dsts[u] = 0;
      if (j < total) {
        unsigned long long q = j / nvec, e = j - q * nvec;
        const char *src = symmem_dev_ptr(v, (int)q, p.in_offset + (p.sliced ? q * p.count : 0)) + 16 * e;
        char *dst = p.out + q * p.count + 16 * e;
        if (dst != src) {
          xs[u] = symmem_dev_load16(src);
          dsts[u] = dst;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < SYMMEM_COLL_UNROLL; u++)
      if (dsts[u])
        symmem_dev_store16(dsts[u], xs[u]);
    symmem_coll_barrier(p, set, false);
    return;
  }
  for (int k = 0; k < v.world; k++) {
    int q = (v.rank + k) % v.world;
    const char *src = symmem_dev_ptr(v, q, p.in_offset + (p.sliced ? q * p.count : 0));
    char *dst = p.out + q * p.count;
    if (dst != src)
      symmem_dev_copy(dst, src, p.count, tid, nthreads);
  }
  /* Pulls only: the peers need our reads done, not our stores. */
  symmem_coll_barrier(p, set, false);
}
#endif
