/*
 * collectives.cu - libsymmem's collectives as CUDA kernels, embedded in the
 * library and compiled at first use with NVRTC for the device at hand
 * (cuda/kernels.go). Built on include/symmem_device.cuh, which NVRTC gets as
 * an in-memory header. Semantics: core/symm/coll.go, Note [Collectives];
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
  int kind;                      /* 72: 0 all-reduce, 2 reduce-scatter (all-gather has its kernel) */
  int algo;                      /* 76: 1 one-shot, 2 two-shot (push), 3 two-shot (pull) */
  int op;                        /* 80: 0 sum, 1 max, 2 min (the kernel's own; checked by the host) */
  int set_base;                  /* 84: the channel's first device set */
  unsigned int digest;           /* 88: digest of the call's arguments (Note [Collective agreement]) */
  int sliced;                    /* 92: all-gather: rank q's input at in_offset + q*count */
};
static_assert(sizeof(symmem_device_view) == 40, "symmem_device_view layout");
static_assert(sizeof(symmem_coll_params) == 96, "symmem_coll_params layout");

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

/* symmem_dev_barrier_block_set with the signal's ordering chosen: publish
 * (release at system scope: our stores, peers' memory included, are visible
 * to the peers after the barrier) or not (relaxed: only this block's
 * completed loads and earlier kernels' writes are ordered before it; see the
 * head of this file). Same counts, same sets, same bounded wait. */
static __device__ __forceinline__ bool symmem_coll_barrier(const symmem_device_view &v, int set, bool publish) {
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
  return __syncthreads_and(ok);
}

/* The opening barrier of a collective, which also compares the call's
 * arguments with every peer's (core/symm/coll.go, Note [Collective
 * agreement]): thread p stores arrival << 32 | digest into peer p's argument
 * slot (set, rank), where arrival is the number of the arrival it then makes
 * (relaxed, as symmem_coll_barrier's unpublishing signal), waits for p's
 * arrival, then reads p's slot in our region until it carries that arrival
 * number (the two stores of p are not ordered: the tag shows a stale slot)
 * and compares digests. A tag past the arrival means p already failed this
 * call and moved on. A difference records SYMMEM_DEV_CAUSE_MISMATCH with p;
 * false in every thread then, before any data moved. */
static __device__ __forceinline__ bool symmem_coll_open(const symmem_device_view &v, int set, unsigned int digest) {
  __syncthreads();
  bool ok = true;
  int p = threadIdx.x;
  if (p < v.world && p != v.rank) {
    const unsigned int n = *(volatile unsigned int *)symmem_dev_set_word(v, v.rank, set, v.world + p) + 1;
    const unsigned long long mine = (unsigned long long)n << 32 | digest;
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(symmem_dev_arg_slot(v, p, set, v.rank)), "l"(mine)
                 : "memory");
    asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(symmem_dev_set_word(v, p, set, v.rank)), "r"(1u)
                 : "memory");
    ok = symmem_dev_wait(v, p, set);
    if (ok) {
      const unsigned long long *slot = symmem_dev_arg_slot(v, v.rank, set, p);
      unsigned long long limit = v.timeout_ns ? v.timeout_ns : SYMMEM_DEV_DEFAULT_TIMEOUT_NS;
      unsigned long long start = symmem_dev_globaltimer();
      unsigned long long theirs;
      for (;;) {
        asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(theirs) : "l"(slot) : "memory");
        if (symmem_dev_reached((unsigned int)(theirs >> 32), n))
          break;
        if (symmem_dev_aborted(v, set) || symmem_dev_globaltimer() - start > limit) {
          symmem_dev_fail(v, p, set);
          ok = false;
          break;
        }
      }
      if (ok && theirs != mine) {
        symmem_dev_fail_cause(v, SYMMEM_DEV_CAUSE_MISMATCH, p, set);
        ok = false;
      }
    }
  }
  return __syncthreads_and(ok);
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

/* OP on two values, as the host backend (core/symm/float.go): max and min
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

  if (!symmem_coll_open(v, set, p.digest))
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
      if (!symmem_coll_barrier(v, set, false))
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
     * (Note [Two-shot pulls] in core/symm/coll.go). */
    if (!symmem_coll_barrier(v, set, true))
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
  symmem_coll_barrier(v, set, push);
}

/* One program per kernel (cuda/kernels.go compiles each at its first use):
 * with SYMMEM_COLL_DT and SYMMEM_COLL_OP defined, the all-reduce and
 * reduce-scatter kernel SYMMEM_COLL_NAME of that dtype (core.DType order)
 * and op; without them, the all-gather. */
#if defined(SYMMEM_COLL_DT)
extern "C" __global__ void __launch_bounds__(SYMMEM_COLL_THREADS) SYMMEM_COLL_NAME(symmem_coll_params p) {
  symmem_coll_reduce<SYMMEM_COLL_DT, SYMMEM_COLL_OP>(p);
}
#else
/* All-gather: count is bytes here. Rank q's input (at in_offset of its
 * block, or at in_offset + q*count when sliced) goes to out + q*count; in
 * place (out + rank*count is our input) our own part is not copied. */
extern "C" __global__ void __launch_bounds__(SYMMEM_COLL_THREADS) symmem_all_gather(symmem_coll_params p) {
  const symmem_device_view &v = p.view;
  const int set = p.set_base + blockIdx.x;
  const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long nthreads = (unsigned long long)gridDim.x * blockDim.x;
  if (!symmem_coll_open(v, set, p.digest))
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
    symmem_coll_barrier(v, set, false);
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
  symmem_coll_barrier(v, set, false);
}
#endif
