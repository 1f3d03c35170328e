/*
 * symmem.h - the C contract of libsymmem.
 *
 * libsymmem is two things behind one header:
 *
 *   1. A caching allocator for GPU (cuda backend) or shared CPU memory (host
 *      backend). symmem_alloc / symmem_free have exactly the signatures that
 *      PyTorch's torch.cuda.memory.CUDAPluggableAllocator loads.
 *   2. Symmetric memory: ranks of a group allocate buffers, rendezvous on
 *      them, and every rank maps every peer's buffer for direct load/store,
 *      with a signal pad per rank for barriers and point-to-point signals.
 *
 * Conventions, true of every function below unless its comment says otherwise:
 *
 *   - Functions that return symmem_result return SYMMEM_SUCCESS (0) or an
 *     error code. Functions that return a pointer return NULL on failure.
 *   - Every failure records a per-thread "last error": a code and a message
 *     naming the call and what was wrong. Success does NOT clear it (as with
 *     errno); call symmem_clear_last_error() first when a void function's
 *     outcome matters (symmem_free).
 *   - Every function is safe to call from any thread at any time. Calls on
 *     one device serialise on that device's lock (symmem_empty_cache holds
 *     it through its device synchronisation, bounded by SYMMEM_TIMEOUT_MS);
 *     calls on a handle or a group are safe concurrently, though collective
 *     calls (group creation, rendezvous, barrier) must be made by every rank
 *     in the same order, and one process runs one collective of a group at a
 *     time (a second waits for the first).
 *   - Releasing while other threads use an object is safe and defined: a
 *     handle or group released or destroyed on one thread makes the calls in
 *     flight on it on other threads return promptly with
 *     SYMMEM_ERROR_INVALID_STATE naming the release (a host-side wait or a
 *     rendezvous waiting for peers is cut short, not left to its timeout),
 *     and every later call on it fails the same way (the pointer is then an
 *     unknown object: never a crash, SYMMEM_ERROR_INVALID_ARGUMENT). Memory
 *     is unmapped only after the calls in flight have returned; if one does
 *     not return within the group's timeout (a driver call stuck), the
 *     memory is left mapped and the release says so.
 *   - Nothing is unmapped while the GPU may still use it: memory is unmapped
 *     after a device synchronisation. When that synchronisation fails or
 *     times out (typically: a peer died while a stream waits for its signal),
 *     the memory is deliberately leaked, left mapped, and the call's error
 *     (SYMMEM_ERROR_TIMEOUT or _BACKEND) says "left mapped (deliberately
 *     leaked)". Likewise, memory whose unmap succeeded but whose release
 *     failed is leaked (never reused) and the error says so. A synchronisation
 *     that timed out stays abandoned in the driver; later ones wait for it
 *     (one blocked thread per device and kind, not one per timeout).
 *   - Bad input never crashes the process: it yields an error code. A bug
 *     of the library that shows as a Go panic is caught at the function's
 *     boundary: the function returns its failure value with
 *     SYMMEM_ERROR_INTERNAL and the panic's text as the last error
 *     (SYMMEM_STRICT=1: the process aborts with that message instead).
 *   - fork(): a process made by fork() without exec after the library was
 *     loaded cannot use it (the library's threads and locks do not survive
 *     fork). In such a child every function below except the last-error
 *     functions returns its failure value at once (NULL, -1, 0, "none" from
 *     symmem_backend_name, SYMMEM_VERSION from symmem_version, out-parameters
 *     set to NULL) with SYMMEM_ERROR_UNAVAILABLE naming fork, without waiting
 *     on any lock; nothing is allocated or freed. Start worker processes with
 *     exec (posix_spawn, or Python multiprocessing's "spawn"/"forkserver").
 *     The child must not touch memory inherited from the library's heap
 *     either: on the host backend those mappings are MADV_DONTFORK, so the
 *     child has nothing there and faults (SIGSEGV) instead of writing into
 *     memory it would share with the parent; the parent's data stays safe.
 *   - Timeouts (timeout_ms arguments, SYMMEM_TIMEOUT_MS) saturate: values
 *     beyond what a 64-bit nanosecond count holds (~292 years) mean "as long
 *     as that", never wrap to a short wait. A timeout_ms of 0 means the
 *     default (the group's timeout; for a new group SYMMEM_TIMEOUT_MS, else
 *     300000); a negative one is SYMMEM_ERROR_INVALID_ARGUMENT. Python's
 *     timeout=None and timeout=0 are that default too.
 *   - Peers are not trusted: memory a peer sends that is smaller than it
 *     announced is refused with SYMMEM_ERROR_PEER naming its rank and pid
 *     (fstat of the memfd on host; cuMemMap refuses on cuda), and every
 *     record's lengths are bounded.
 *   - The header needs no CUDA header: struct CUstream_st is the type behind
 *     both CUstream and cudaStream_t, so symmem_stream_t is the same type.
 *
 * Environment variables read when the library starts:
 *   SYMMEM_BACKEND=auto|cuda|host   which backend to open (default auto: cuda
 *                                   when the driver loads and a device exists)
 *   SYMMEM_LIBCUDA=path             the CUDA driver library (default libcuda.so.1).
 *                                   An order: when it is set and does not load,
 *                                   no backend opens and every call is
 *                                   SYMMEM_ERROR_UNAVAILABLE naming it and the
 *                                   loader's error; with SYMMEM_BACKEND=auto set
 *                                   the next backend opens after one warning on
 *                                   stderr.
 *   SYMMEM_STRICT=1                 abort with the message on an invalid or
 *                                   double-freed pointer instead of returning
 *   SYMMEM_TIMEOUT_MS=n             default timeout of group waits, signals and
 *                                   device synchronisation (300000; huge
 *                                   values saturate); Python uses it too
 *   SYMMEM_SOCKET_DIR=dir           where rendezvous sockets live
 *                                   (default $TMPDIR/symmem-<uid>, mode 0700)
 *   SYMMEM_ALLOW_OVERLAPPING_DEVICES=1  let several ranks of a group share a
 *                                   device (correctness testing)
 *   SYMMEM_MACHINE_ID=s             testing: the machine this process claims
 *                                   to be on, to imitate several machines on
 *                                   one host (never joins two real machines;
 *                                   see symmem_group_local_rank)
 *   SYMMEM_JOB_TOKEN=s              tells apart two jobs that use the same group
 *                                   name (default: torchrun's or Slurm's job id)
 *   SYMMEM_HEAP_RESERVE=bytes       address space reserved per heap range
 *                                   (default twice the device's memory)
 *   SYMMEM_TRACE=1                  print the phases of each rendezvous to stderr
 *   SYMMEM_LIBNVRTC=path            NVRTC, which compiles the collectives' kernels
 *                                   (default: a copy already loaded,
 *                                   libnvrtc.so.13/.12, PyTorch's nvidia-* wheels,
 *                                   the CUDA toolkit)
 *   SYMMEM_CACHE_DIR=dir            the kernels' disk cache is dir/kernels
 *                                   (default ~/.cache/libsymmem/kernels)
 *   SYMMEM_ONE_SHOT_MAX_BYTES=n     the largest all-reduce SYMMEM_ALGO_AUTO runs
 *                                   one-shot in place or on 3+ ranks
 *                                   (default 262144; in place on 2 ranks
 *                                   1 MiB)
 *   SYMMEM_TWO_SHOT_PULL_MIN_BYTES=n  the smallest two-shot all-reduce whose
 *                                   second phase reads the peers' slices
 *                                   rather than storing into the peers
 *                                   (default 8 MiB)
 *   SYMMEM_LL_MAX_BYTES=n           the most data per rank and peer of a
 *                                   low-latency collective, which also sizes
 *                                   its buffers (2 * world * 2n bytes of each
 *                                   pad; default 256 KiB; 0: off; the same on
 *                                   every rank)
 *   SYMMEM_LEAVE_SMS=1              SYMMEM_ALGO_AUTO runs every collective of a
 *                                   group of one machine on the copy engines
 *                                   (SYMMEM_ALGO_COPY_ENGINE; the same on
 *                                   every rank)
 *   SYMMEM_CE_REDUCE_BLOCKS=n       blocks of the copy engines' reduction
 *                                   kernel (1, 2, 4, ..., 64; default 16)
 *   SYMMEM_SIGNAL_KERNEL=0          stream signals and barriers through
 *                                   cuStreamBatchMemOp rather than one small
 *                                   kernel with bounded waits
 *   SYMMEM_COLL_PDL=0               launch the kernels without programmatic
 *                                   dependent launch
 *   SYMMEM_COLL_UNCHECKED=1         collectives skip the argument agreement:
 *                                   for measuring its cost only (ranks that
 *                                   disagree then compute wrong numbers)
 */
#ifndef SYMMEM_H
#define SYMMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SYMMEM_VERSION_MAJOR 0
#define SYMMEM_VERSION_MINOR 1
#define SYMMEM_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH */
#define SYMMEM_VERSION                                                          \
  (SYMMEM_VERSION_MAJOR * 10000 + SYMMEM_VERSION_MINOR * 100 +                  \
   SYMMEM_VERSION_PATCH)

struct CUstream_st;
/* A CUDA stream (CUstream / cudaStream_t). NULL is the legacy default stream.
 * The host backend runs synchronously and only numbers streams. */
typedef struct CUstream_st *symmem_stream_t;

/* Result codes. The values are fixed and will never change. */
typedef enum symmem_result {
  SYMMEM_SUCCESS = 0,
  SYMMEM_ERROR_INVALID_ARGUMENT = 1, /* NULL where a value is needed, bad size, rank, channel */
  SYMMEM_ERROR_OUT_OF_MEMORY = 2,    /* the memory limit or the device said no */
  SYMMEM_ERROR_INVALID_POINTER = 3,  /* not allocated here, or already freed */
  SYMMEM_ERROR_INVALID_DEVICE = 4,   /* device index out of range */
  SYMMEM_ERROR_BACKEND = 5,          /* the driver or the OS failed; the message has its words */
  SYMMEM_ERROR_UNAVAILABLE = 6,      /* the backend or feature cannot run here */
  SYMMEM_ERROR_TIMEOUT = 7,          /* a wait ran out of time */
  SYMMEM_ERROR_MISMATCH = 8,         /* ranks disagree (sizes, offsets, members) */
  SYMMEM_ERROR_PEER = 9,             /* a peer failed, died or broke the protocol */
  SYMMEM_ERROR_PERMISSION = 10,      /* a peer of another user, or a refused operation */
  SYMMEM_ERROR_INVALID_STATE = 11,   /* the call is not allowed now (e.g. released handle) */
  SYMMEM_ERROR_INTERNAL = 12,        /* a bug in libsymmem: please report it */
  SYMMEM_ERROR_ABORTED = 13,         /* the group was aborted (symmem_group_abort) */
  SYMMEM_ERROR_INTERRUPTED = 14      /* a signal interrupted a wait (symmem_set_interrupt_fd) */
} symmem_result;

/* ---------------------------------------------------------------------------
 * Version, errors, backend
 * ------------------------------------------------------------------------- */

/* The library's version, as SYMMEM_VERSION computes it. Compare with the
 * header's SYMMEM_VERSION to detect a mismatched library. */
int symmem_version(void);

/* A fixed English description of code. Never NULL; the string is static.
 * Works for unknown codes: every unknown code gets the same static string,
 * "unknown result code" (nothing is allocated per code). */
const char *symmem_strerror(symmem_result code);

/* The code of the last failure on the calling thread (SYMMEM_SUCCESS if none
 * since the thread started or since symmem_clear_last_error). */
symmem_result symmem_last_error(void);

/* The message of the last failure on the calling thread, "" if none. The
 * library owns the string: it stays valid until the next failing call on the
 * same thread. Never NULL. Messages are kept whole up to 64 KiB; a longer
 * one is cut at a word boundary and ends with an ellipsis (U+2026).
 * A string the caller passed (a group name, a tag, a path, a setting's
 * value) appears at most once in a message, quoted and cut at 64
 * characters with an ellipsis and its length ("aaaa", U+2026, then
 * " (3000 characters)"). Messages stay under 1 KiB, except
 * those of collective calls that list a value per rank (mismatched sizes,
 * offsets or backends, ranks that never arrived), which grow with the
 * world size. */
const char *symmem_last_error_message(void);

/* Copies the last error message into buf (capacity len, always NUL-terminated
 * when len > 0). Returns the message length (excluding NUL), like snprintf,
 * so a return >= len means it was truncated. buf may be NULL when len is 0. */
size_t symmem_copy_last_error(char *buf, size_t len);

/* Resets the calling thread's last error to SYMMEM_SUCCESS and "". */
void symmem_clear_last_error(void);

/* The name of the backend in use: "cuda" or "host". If no backend could be
 * opened, returns "none" and every allocation fails with
 * SYMMEM_ERROR_UNAVAILABLE. Static string. */
const char *symmem_backend_name(void);

/* Why backends were skipped during selection (e.g. "cuda backend unavailable:
 * libcuda.so.1: cannot open shared object file"), one per line, "" if none.
 * Static for the life of the process. */
const char *symmem_backend_notes(void);

/* Number of devices of the backend (the host backend has one: device 0). */
int symmem_device_count(void);

/* The diagnostic report, as a JSON object: the library's version and path;
 * the backend, why it was chosen, and backend_notes; each device (name,
 * memory); the CUDA driver's version, each GPU (name, memory, compute
 * capability, UUID, VMM / POSIX-fd / fabric / multicast support, queried
 * with cuDeviceGetAttribute and never used) and each ordered pair of GPUs
 * (peer access, native atomics, the link inferred from them); optional
 * libraries (NCCL, NVRTC: found or not, version, path; "not built yet" where
 * the library has no loader for one); the socket directory, its owner and
 * mode; every SYMMEM_* variable set, how it was read and any error. Keys are
 * only ever added. Writes at most len bytes into buf (NUL-terminated when
 * len > 0) and returns the report's length without the NUL, like snprintf:
 * call with (NULL, 0) to size the buffer. The report is made anew at each
 * call (it may load the CUDA driver). Returns 0 with the last error set on
 * an internal failure. python -m symmem and symmem-info print it. */
size_t symmem_info_json(char *buf, size_t len);

/* ---------------------------------------------------------------------------
 * The caching allocator (PyTorch's CUDAPluggableAllocator ABI)
 * ------------------------------------------------------------------------- */

/* Allocates size bytes on device, for use in stream order on stream.
 * Returns device memory (cuda) or shared CPU memory (host), aligned to at
 * least 512 bytes, or NULL with the last error set:
 *   - SYMMEM_ERROR_OUT_OF_MEMORY: size is beyond the device's memory limit
 *     (SIZE_MAX included) or the device is full after freeing idle cache;
 *   - SYMMEM_ERROR_INVALID_DEVICE: device < 0 or >= symmem_device_count();
 *   - SYMMEM_ERROR_UNAVAILABLE: no backend.
 * size 0 returns a distinct non-NULL pointer to a minimum block (512 bytes),
 * which must be freed like any other, so that two live empty tensors never
 * share a pointer in PyTorch's bookkeeping.
 * Placement is a pure function of the sequence of calls: two processes making
 * the same calls (streams numbered by first use) receive the same offsets in
 * their heaps. Blocks freed on a stream are reused only on that stream.
 * Thread caches (SYMMEM_THREAD_CACHE, on by default): a block of at most
 * 128 MiB freed by a thread may be kept in that thread's cache and handed to
 * its next symmem_alloc of the same rounded size and stream (the newest
 * first) without entering the allocator's lock; placement is then a pure
 * function of each thread's own sequence of calls. Allocations inside a
 * symmem_region_begin region, blocks given to symmem_record_stream and
 * history recording bypass the caches; symmem_empty_cache, memory limits,
 * the out-of-memory retry and group creation give cached blocks back first.
 * A block one rank freed into its cache between group creation and a
 * symmetric allocation can move that allocation (symmem_rendezvous then
 * reports the diverged placement): call symmem_thread_caches_drain (or
 * symmem_empty_cache) first; the Python package's symmem.empty and
 * symmem.torch.empty do. */
void *symmem_alloc(size_t size, int device, symmem_stream_t stream);

/* Returns ptr to the cache. ptr NULL is a no-op. size, device and stream are
 * what the allocation was made with; size and stream are only checked against
 * the allocation (size mismatch is reported as INVALID_ARGUMENT but the block
 * is still freed), the recorded values are used. A pointer not allocated here,
 * an interior pointer, or a double free changes nothing and sets the last
 * error to SYMMEM_ERROR_INVALID_POINTER (with SYMMEM_STRICT=1: the message is
 * printed and the process aborts). */
void symmem_free(void *ptr, size_t size, int device, symmem_stream_t stream);

/* Like symmem_alloc, but throws a C++ std::runtime_error carrying the message
 * when the allocation fails. This is the alloc_fn to give PyTorch when
 * libsymmem is the *global* allocator (change_current_allocator), where a NULL
 * return would become a tensor at address 0: the exception surfaces in Python
 * as RuntimeError. Never call it from C. Inside torch.cuda.MemPool use
 * symmem_alloc (PyTorch treats NULL as out-of-memory there). */
void *symmem_alloc_or_throw(size_t size, int device, symmem_stream_t stream);

/* Marks that ptr (allocated here) is used on stream as well as on its
 * allocation stream: when ptr is freed, its allocation stream is made to wait
 * for the work queued on stream so far, before the block is reused.
 * Signature of CUDAPluggableAllocator's record_stream_fn. */
void symmem_record_stream(void *ptr, symmem_stream_t stream);

/* CUDAPluggableAllocator's init_fn: opens the backend early. No-op after. */
void symmem_init(int device_count);

/* CUDAPluggableAllocator's reset_fn: symmem_empty_cache for every device. */
void symmem_reset(void);

/* CUDAPluggableAllocator's memory_fraction_fn: sets device's memory limit to
 * fraction (0 < fraction <= 1) of its total memory. Bad input (NaN, <= 0,
 * > 1, or a fraction so small that it rounds to 0 bytes, which would mean
 * "no limit") sets the last error to SYMMEM_ERROR_INVALID_ARGUMENT and leaves
 * the limit unchanged. */
void symmem_memory_fraction(double fraction, int device);

/* Releases every cached segment of device that holds no allocated block,
 * after synchronising the device so that no queued work can still use it.
 * device -1 means every device. Physical memory goes back to the backend;
 * the address range stays reserved. Live handles are not affected: a
 * segment that peers mapped through a rendezvous stays mapped in their
 * processes until their handles are released (the physical memory returns
 * only then), and a block that holds a live allocation is never released.
 * If the synchronisation fails, nothing is released (SYMMEM_ERROR_TIMEOUT
 * or _BACKEND); if a segment is unmapped but its memory cannot be released,
 * it leaves the cache anyway (leaked, said in the error).
 * Deliberate limit: the device's allocator lock is held through the device
 * synchronisation (at most SYMMEM_TIMEOUT_MS), so other threads' calls on
 * that device wait for it. Releasing the lock meanwhile would let an
 * allocation's placement depend on timing: whether the sync succeeds
 * (segments released, their heap range free for a new segment) or times out
 * (segments kept and reusable) decides where a concurrent allocation would
 * go, and invariant 2 (placement is a pure function of the call sequence,
 * which keeps offsets symmetric across ranks) forbids that. */
symmem_result symmem_empty_cache(int device);

/* Gives every block held in a thread cache (symmem_alloc's comment) of
 * device (-1: every device) back to the allocator, as if the caches were
 * off for every free so far: the allocator's placement then sees what it
 * would have seen without them, so that an allocation made next on every
 * rank lands at the same offset even where one rank freed scratch memory
 * that the others did not. No device synchronisation, no segment released.
 * SYMMEM_ERROR_INVALID_DEVICE for a bad device. Thread-safe. */
symmem_result symmem_thread_caches_drain(int device);

/* Sets device's memory limit: reserved bytes (segments) never exceed it;
 * an allocation that would first releases idle cached segments and then
 * fails with SYMMEM_ERROR_OUT_OF_MEMORY. 0 removes the limit (the default
 * is no limit beyond what the device has). Does not free memory already in
 * use above the limit. */
symmem_result symmem_set_memory_limit(int device, size_t bytes);

/* Writes device's memory limit (0 = none) to *bytes. */
symmem_result symmem_get_memory_limit(int device, size_t *bytes);

/* One statistic: key uses torch.cuda.memory_stats' names, e.g.
 * "allocated_bytes.all.current". key points to a static string. */
typedef struct symmem_stat {
  const char *key;
  int64_t value;
} symmem_stat;

/* Fills out[0..min(capacity, count)) with device's statistics and returns
 * count, how many there are in all (call with capacity 0 to size the array;
 * a capacity below count copies the first capacity of them, a larger one
 * leaves the rest of out untouched); keys are always in the same order, and
 * later versions only add keys at the end. Returns 0 with the last error set on a bad device.
 * Keys, every key of torch.cuda.memory_stats() with the same meaning (STAT is
 * allocation, segment, active, allocated_bytes, reserved_bytes, active_bytes,
 * requested_bytes; then the same for inactive_split, inactive_split_bytes,
 * paused_bytes;
 * POOL is all, small_pool, large_pool). "active" equals "allocated" here: a
 * freed block is reusable at once on its stream, so no block is
 * inactive-but-pending as in PyTorch. inactive_split counts free blocks of
 * segments that hold other blocks too (fragmentation that
 * symmem_empty_cache cannot release). There is no max_split_size option, as
 * in PyTorch's default: max_split_size is -1 and oversize_* are 0.
 * paused_bytes counts segments whose physical memory symmem_pause released
 * (they are not in reserved_bytes then). memory_limit is 0 when there is none.
 * thread_cache and thread_cache_bytes (not PyTorch's) count the blocks that
 * the user freed and a thread's cache keeps for that thread's next
 * symmem_alloc of the same size and stream (SYMMEM_THREAD_CACHE, docs/design.md):
 * freed as far as allocation and *_bytes are concerned, still in their
 * segments. The counts are exact whenever read; segment and reserved_bytes
 * follow placement, which the caches change. In this order:
 *   STAT.POOL.current, .peak, .allocated, .freed (the seven first STATs)
 *   num_alloc_retries, num_ooms, num_device_alloc, num_device_free,
 *   num_sync_all_streams, memory_limit,
 *   inactive_split.POOL.*, inactive_split_bytes.POOL.*,
 *   oversize_allocations.current/.peak/.allocated/.freed,
 *   oversize_segments.current/.peak/.allocated/.freed, max_split_size,
 *   thread_cache.POOL.*, thread_cache_bytes.POOL.* */
size_t symmem_stats(int device, symmem_stat *out, size_t capacity);

/* Heap snapshots and allocation history, in the shape of PyTorch's memory
 * snapshots (symmem.torch.memory_snapshot builds torch's dict from them).
 *
 * symmem_memory_snapshot_json writes a JSON object
 *   {"segments": [{"device", "address", "total_size", "allocated_size",
 *                  "active_size", "requested_size", "stream",
 *                  "segment_type": "small"|"large",
 *                  "blocks": [{"address", "size", "requested_size",
 *                              "state": "active_allocated"|"inactive",
 *                              "context"}]}],
 *    "device_traces": [[{"action", "addr", "size", "stream", "time_us",
 *                        "context"}] per device],
 *    "recording": bool}
 * covering every device's allocator: segments in address order, their
 * blocks tiling them in address order. "action" is alloc, free_requested,
 * free_completed (a free completes at once), segment_alloc or segment_free;
 * "size" is the bytes asked for (blocks) or the segment's size. "context" is
 * the number the context hook returned for the allocation (0: none). Writes
 * at most len bytes into buf (NUL-terminated when len > 0) and returns the
 * document's length, like snprintf; the heap may change between two calls,
 * so retry with a larger buffer while the result is >= len. Returns 0 with
 * the last error set when there is no backend. Thread-safe; each device's
 * part is consistent (taken under its lock). */
size_t symmem_memory_snapshot_json(char *buf, size_t len);

/* Starts recording the allocation history of every device (max_entries > 0:
 * a ring of the last max_entries events per device, cleared now) or stops it
 * (0). Off by default; recording costs one event per call. Returns
 * SYMMEM_ERROR_INVALID_ARGUMENT above 2^26 entries. */
symmem_result symmem_record_history(size_t max_entries);

/* A context hook: called after each successful symmem_alloc while recording
 * is on, on the allocating thread, with no lock of the library held; returns
 * a number naming the caller's context (e.g. an interned stack trace; 0:
 * none), which snapshots report with the block and its alloc event. */
typedef uint64_t (*symmem_context_fn)(void *user);

/* Installs fn (NULL removes it) with user passed back to it. The hook must
 * not call into libsymmem's allocator. Returns SYMMEM_SUCCESS. */
symmem_result symmem_set_context_hook(symmem_context_fn fn, void *user);

/* Sets every .peak statistic of device to its .current value. */
symmem_result symmem_reset_peak_stats(int device);

/* Where a pointer lives. */
typedef struct symmem_pointer_info {
  void *block;          /* start of the allocated block holding the pointer */
  size_t block_size;    /* the block's size in bytes (>= the requested size) */
  size_t requested_size;/* the size asked for */
  size_t offset;        /* pointer - block */
  uint64_t heap_offset; /* block's offset in the device heap (symmetric) */
  int device;
  int reserved_;
} symmem_pointer_info;

/* Fills *info for a pointer anywhere inside a live allocation. Returns
 * SYMMEM_ERROR_INVALID_POINTER if ptr is not inside one. */
symmem_result symmem_pointer_get_info(const void *ptr, symmem_pointer_info *info);

/* Copies n bytes from src to dst with the backend (cuMemcpyAsync on stream,
 * then waits for it, on cuda; memcpy on host). Either side may be device
 * memory of device (local or a peer's mapped through a handle) or host memory;
 * this lets a C program with no CUDA runtime move data in and out of buffers.
 * n 0 is a no-op; NULL dst or src with n > 0 is SYMMEM_ERROR_INVALID_ARGUMENT.
 * A pointer the library knows (inside a live block, a peer's mapped segment
 * or a signal pad) must have its n bytes inside that block or mapping, else
 * SYMMEM_ERROR_INVALID_ARGUMENT before anything is touched. Other pointers
 * are the caller's: on the host backend the copy runs in Go and a fault on
 * them is SYMMEM_ERROR_INVALID_ARGUMENT naming the address, not a crash; on
 * cuda the driver checks device pointers, and host pointers must be valid.
 * The wait for stream has no time limit (work queued there before the copy,
 * such as a barrier whose peer died, delays it as long): a copy given up
 * while the device may still carry it out could write into memory the
 * caller has moved on from. */
symmem_result symmem_copy(void *dst, const void *src, size_t n, int device,
                          symmem_stream_t stream);

/* Sets n bytes at dst (device memory of device, or host memory on the host
 * backend) to value, with the backend, and waits for it. Pointers are checked
 * as for symmem_copy. */
symmem_result symmem_memset(void *dst, int value, size_t n, int device,
                            symmem_stream_t stream);

/* Runs the allocator's invariant checker on device (blocks tile segments,
 * free neighbours merged, pools and statistics consistent). Returns
 * SYMMEM_ERROR_INTERNAL with the first broken invariant in the message. */
symmem_result symmem_validate(int device);

/* ---------------------------------------------------------------------------
 * Symmetric memory: groups, rendezvous, signal pads
 * ------------------------------------------------------------------------- */

/* A group of ranks that rendezvous together. Opaque. */
typedef struct symmem_group symmem_group;
/* The result of a rendezvous: every rank's buffer and signal pad, mapped
 * here. Opaque. */
typedef struct symmem_handle symmem_handle;

/* An all-gather supplied by the caller (MPI_Allgather fits): gather
 * bytes_per_rank bytes from every rank; recv holds world_size * bytes_per_rank
 * bytes, rank r's at r * bytes_per_rank. Return 0 on success, anything else on
 * failure. Called from the thread that made the collective call. */
typedef int (*symmem_allgather_fn)(const void *send, void *recv,
                                   size_t bytes_per_rank, void *user);

/* Creates this process's member of group name (letters, digits, '.', '_',
 * '-', at most 64 characters). Collective: all world_size ranks must call it;
 * it returns once all have arrived. Ranks find each other through Unix sockets
 * in SYMMEM_SOCKET_DIR (peers of another uid are refused). timeout_ms bounds
 * every wait of the group (0: SYMMEM_TIMEOUT_MS or 300000; negative:
 * SYMMEM_ERROR_INVALID_ARGUMENT); on expiry the
 * error names the ranks that never arrived. device is the device this rank's
 * buffers live on. On success *out owns the group. */
symmem_result symmem_group_create(const char *name, int rank, int world_size,
                                  int device, int64_t timeout_ms,
                                  symmem_group **out);

/* As symmem_group_create, but small records are all-gathered through
 * allgather (file descriptors still travel over the Unix socket channel). */
symmem_result symmem_group_create_with_allgather(
    const char *name, int rank, int world_size, int device, int64_t timeout_ms,
    symmem_allgather_fn allgather, void *user, symmem_group **out);

/* Leaves the group and frees it (not collective: peers in a collective with
 * this rank fail with SYMMEM_ERROR_PEER naming it). Handles of the group stay
 * valid until released; the group's memory goes with the last of them. A
 * rendezvous of this group in flight on another thread returns at once with
 * SYMMEM_ERROR_INVALID_STATE (with a caller-supplied allgather, destroy waits
 * for the callback in progress to return). NULL is a no-op. */
symmem_result symmem_group_destroy(symmem_group *group);

/* Aborts this rank's member of group: a way out of every wait on it that
 * does not wait for the timeout (a peer died or hangs, the job is being
 * torn down). Safe from any thread, at any time (a call of the group may
 * be in flight on another thread: it is what the abort is for), any number
 * of times. It returns at once, after:
 *   - every wait of this rank on the group has been released: a host-side
 *     wait (group collective, or barrier, signal wait or collective on the
 *     host backend) returns SYMMEM_ERROR_ABORTED; on cuda the stream waits
 *     of barriers and signals this rank enqueued are satisfied (this rank's
 *     own counts are written forward, through the library's own stream,
 *     bounded by the group's timeout) and waiting collective kernels give up
 *     (the abort word of the device region; symmem_handle_device_error then
 *     returns SYMMEM_ERROR_ABORTED). What the released work computed is
 *     undefined;
 *   - every later call on the group or its handles returns
 *     SYMMEM_ERROR_ABORTED (the getters and symmem_handle_device_error still
 *     answer).
 * symmem_handle_release and symmem_group_destroy then work as usual. The
 * abort is this rank's alone: peers see it as a rank that stopped
 * (TIMEOUT, or PEER once its process exits) unless they abort too. Returns
 * SYMMEM_SUCCESS, or the error of the writes that release the stream waits
 * (the group is aborted either way). */
symmem_result symmem_group_abort(symmem_group *group);

/* Interrupts: makes fd, the read end of a self-pipe that a signal handler
 * writes to, the process's interrupt descriptor (-1: none, the default; a
 * new one replaces the old). While it is set, every host-side wait of the
 * library that may last (group creation, group collectives, and barriers,
 * signal waits and collectives on the host backend) returns
 * SYMMEM_ERROR_INTERRUPTED within about 50 ms of a byte arriving on fd, and:
 *   - group creation fails and leaves nothing behind (the peers fail with
 *     SYMMEM_ERROR_PEER or TIMEOUT);
 *   - a wait of a group aborts it (symmem_group_abort): later calls on it
 *     return SYMMEM_ERROR_ABORTED; destroy it.
 * The library reads fd itself on a thread of its own (the caller must not;
 * it never closes it): bytes that arrive while no wait is in progress are
 * consumed and interrupt nothing. Without a descriptor a signal does not
 * shorten a wait: the library retries system calls that it interrupts
 * (EINTR) and waits on to its timeout. Fast paths pay nothing: a wait reads
 * one counter when it starts and checks it only once it sleeps. Python's
 * package sets its own (signal.set_wakeup_fd) so that Ctrl-C raises
 * KeyboardInterrupt within 0.5 s. SYMMEM_ERROR_INVALID_ARGUMENT when fd is
 * not an open descriptor. Thread-safe. */
symmem_result symmem_set_interrupt_fd(int fd);

/* The rank / world size / device of a group (-1 with the last error if group
 * is NULL). */
int symmem_group_rank(const symmem_group *group);
int symmem_group_world_size(const symmem_group *group);
int symmem_group_device(const symmem_group *group);

/* Local teams. A group made over an NCCL communicator or with
 * symmem_group_create_with_allgather may hold ranks on several machines (a
 * group made with symmem_group_create needs one and refuses several with
 * SYMMEM_ERROR_MISMATCH naming them). Each rank's machine is its host name
 * and kernel boot id, read when the library loads (SYMMEM_MACHINE_ID replaces
 * it for tests imitating machines on one host; two ranks claiming one machine
 * under different kernels are refused). The ranks of one machine form its
 * local team, in rank order: only they map each other's buffers and signal
 * pads, and a handle's pointers (and pointer arrays) hold NULL for every rank
 * of another machine. Collectives, barriers and signals to such ranks go
 * through the group's NCCL communicator (docs/machines.md).
 *
 * Ranks whose devices share an NVLink domain (fabric handles on, and a
 * driver that names the fabric cluster and clique) form one team across
 * machines: their memory travels as fabric handles through the group's
 * all-gather.
 *
 * local_rank: this rank's index in its team; local_size: the team's size;
 * is_local: 1 if rank is in this process's team (its machine, or its NVLink
 * domain), so mapped here, 0 if not. Each returns -1
 * with the last error on a NULL group or, for is_local, a rank out of range.
 * Thread-safe. */
int symmem_group_local_rank(const symmem_group *group);
int symmem_group_local_size(const symmem_group *group);
int symmem_group_is_local(const symmem_group *group, int rank);

/* Names rank's machine for messages ("host n1 (boot id ...)", or
 * "machine \"a\" (SYMMEM_MACHINE_ID on host n1)"): writes at most len bytes
 * into buf (NUL-terminated when len > 0) and returns the name's length
 * without the NUL, like snprintf. Returns 0 with the last error on a NULL
 * group or a rank out of range. */
size_t symmem_group_machine(const symmem_group *group, int rank, char *buf,
                            size_t len);

/* Sets the size of each rank's signal pad (bytes, multiple of 4, >= 4*world)
 * of group. Only before the group's first rendezvous. Default 64 KiB: pads of
 * that size are made and exchanged by symmem_group_create; another size set
 * here replaces them at the first rendezvous, which fails with
 * SYMMEM_ERROR_MISMATCH on every rank unless every rank set the same size. */
symmem_result symmem_group_set_signal_pad_size(symmem_group *group,
                                               size_t bytes);

/* Collective: every rank of group calls it with a pointer into a block of its
 * own, allocated by symmem_alloc on the group's device by the same sequence
 * of calls on every rank. ptr may point inside the block. Validates on every
 * rank that block sizes, heap offsets, the pointer's offset in its block
 * and devices agree (a mismatch is
 * SYMMEM_ERROR_MISMATCH naming the ranks that differ). On success *out owns a
 * handle whose buffer pointers are the peers' blocks mapped here (those of
 * this machine's ranks: NULL for the others, see symmem_group_is_local); on
 * a group over an NCCL communicator the block's segment is also registered
 * as a window, collectively, which is how remote ranks reach it. A handle
 * stays valid after the block is freed, until released. */
symmem_result symmem_rendezvous(void *ptr, symmem_group *group,
                                symmem_handle **out);

/* Releases a handle; peers' memory is unmapped when no handle uses it, after
 * a device synchronisation (if that fails, it is left mapped and the error
 * says so). Signal calls on the handle in flight on other threads return
 * first (a host-side wait gives up with SYMMEM_ERROR_INVALID_STATE); release
 * waits for them up to the group's timeout, then leaves the memory mapped
 * and fails with SYMMEM_ERROR_TIMEOUT. Pointers obtained from the handle
 * (buffer and pad pointers, pointer arrays) must not be used afterwards.
 * A second release is SYMMEM_ERROR_INVALID_ARGUMENT (an unknown handle).
 * NULL is a no-op. */
symmem_result symmem_handle_release(symmem_handle *handle);

int symmem_handle_rank(const symmem_handle *handle);
int symmem_handle_world_size(const symmem_handle *handle);
/* The size of the block rendezvoused on (same on every rank). */
size_t symmem_handle_buffer_size(const symmem_handle *handle);
/* The offset of the rendezvous pointer in its block. */
size_t symmem_handle_offset(const symmem_handle *handle);
/* The size of each rank's signal pad. */
size_t symmem_handle_signal_pad_size(const symmem_handle *handle);
/* rank's block (start of block) / signal pad, mapped in this process. NULL
 * with SYMMEM_ERROR_INVALID_ARGUMENT when rank is out of range; NULL (and no
 * error) for a rank on another machine, which is never mapped (see
 * symmem_group_is_local). */
void *symmem_handle_buffer_ptr(const symmem_handle *handle, int rank);
void *symmem_handle_signal_pad_ptr(const symmem_handle *handle, int rank);
/* Arrays of world_size pointers, owned by the handle: in host memory, and in
 * device memory for kernels (on the host backend the same array); NULL
 * entries for ranks on other machines. Read-only:
 * handles of one group whose pointers are equal (a rendezvous again on the
 * same buffer) share the arrays, which live until the last of them is
 * released. */
void *const *symmem_handle_buffer_ptrs(const symmem_handle *handle);
void *const *symmem_handle_signal_pad_ptrs(const symmem_handle *handle);
void *const *symmem_handle_buffer_ptrs_dev(const symmem_handle *handle);
void *const *symmem_handle_signal_pad_ptrs_dev(const symmem_handle *handle);

/* Every property above at once, as the getters return them one by one: for
 * bindings that read them all after each rendezvous (one call instead of
 * nine). */
typedef struct symmem_handle_desc {
  int rank;
  int world_size;
  size_t buffer_size;
  size_t offset;
  size_t signal_pad_size;
  void *const *buffer_ptrs;
  void *const *signal_pad_ptrs;
  void *const *buffer_ptrs_dev;
  void *const *signal_pad_ptrs_dev;
} symmem_handle_desc;

/* The number of peers whose buffer and signal pad this process maps: the
 * other ranks of its local team (world_size - 1 on one machine). -1 with the
 * last error if handle is not a live handle. (A getter of its own rather than
 * a field of symmem_handle_desc: a program built against a header with the
 * smaller struct would be written past its end.) */
int symmem_handle_mapped_peers(const symmem_handle *handle);

/* Fills *desc with handle's properties. SYMMEM_ERROR_INVALID_ARGUMENT when
 * desc is NULL or handle is not a live handle (desc untouched). The arrays
 * are the handle's, with the getters' lifetime. Thread-safe. */
symmem_result symmem_handle_describe(const symmem_handle *handle,
                                     symmem_handle_desc *desc);

/* Signals. Slot channel*world_size + sender of the receiver's signal pad is
 * a 32-bit count: how many signals the sender has put to the receiver on that
 * channel (modulo 2^32; only the sender writes it). A channel is in
 * [0, signal_pad_size / (4*world_size)). Each (sender, receiver, channel) is
 * a counting semaphore:
 *
 * put_signal: adds one to our count in dst_rank's pad. Never waits for the
 *   receiver; several signals may be in flight.
 * wait_signal: consumes one signal: the k-th wait for src_rank on a channel
 *   returns once src_rank's count in our pad has reached k (compared as
 *   (int32_t)(count - k) >= 0, so wrap-around is harmless).
 * barrier: put_signal to every peer, then wait_signal from every peer.
 *
 * Kernels that use the pads directly follow the same rule: a sender stores
 * (or atomically adds to reach) its next count with release semantics; a
 * receiver waits until the slot has reached the count it expects.
 *
 * On the cuda backend they are enqueued on stream (a stream write of the next
 * count into the peer's pad, a stream wait CU_STREAM_WAIT_VALUE_GEQ on ours; a
 * barrier is one cuStreamBatchMemOp), ordered with the caller's other work
 * there, and return at once; the timeout is not enforced by the GPU. Puts to
 * one (rank, channel) run in call order when they go to one stream (or to
 * streams the caller orders). On the host backend they run on the calling
 * thread (puts are atomic adds) and wait_signal fails with
 * SYMMEM_ERROR_TIMEOUT after timeout_ms (0: the group's timeout; negative:
 * SYMMEM_ERROR_INVALID_ARGUMENT), or with
 * SYMMEM_ERROR_PEER within about 10 ms when the awaited rank's process exits
 * (naming its rank, pid and exit status; a stopped process still gets the
 * timeout), consuming nothing: the next wait waits for the same signal. A
 * barrier that fails keeps what it did: its puts stand and its waits count
 * as consumed, so on the host backend the linear barrier's k-th call keeps
 * meeting every peer's k-th (a late peer's barrier returns success: every
 * rank entered it), and a dissemination barrier (SYMMEM_BARRIER) that
 * fails in one round puts no signal of the rounds after it, so the peers
 * that wait for those time out rather than pass a barrier some rank never
 * entered (that channel then fails on those peers: use another channel
 * or group). A stream wait takes its number when enqueued: one that gives
 * up (recorded in the device error flag) keeps it. A rank or channel out of
 * range is SYMMEM_ERROR_INVALID_ARGUMENT naming the bounds. After a failed
 * put or a failed enqueue the counts of its channel may disagree between
 * ranks: use another channel or group.
 *
 * Ranks on other machines (symmem_group_is_local 0) are reached through the
 * group's NCCL communicator: put/wait through NCCL's one-sided signals
 * (ncclSignal / ncclWaitSignal, NCCL 2.29 or later: with an older NCCL they
 * are SYMMEM_ERROR_UNAVAILABLE naming the version found and 2.29), enqueued
 * on stream. NCCL 2.29 has one signal slot per peer: across machines only
 * channel 0 carries signals (another channel is SYMMEM_ERROR_INVALID_ARGUMENT
 * naming the limit). A barrier of a group that spans machines signals
 * through them too, or, without them or on another channel, runs an NCCL
 * all-reduce of one int32 on stream. On a
 * group with no communicator (symmem_group_create_with_allgather) they are
 * SYMMEM_ERROR_UNAVAILABLE naming the missing engine. */
symmem_result symmem_put_signal(symmem_handle *handle, int dst_rank,
                                int channel, symmem_stream_t stream);
symmem_result symmem_wait_signal(symmem_handle *handle, int src_rank,
                                 int channel, int64_t timeout_ms,
                                 symmem_stream_t stream);
symmem_result symmem_barrier(symmem_handle *handle, int channel,
                             int64_t timeout_ms, symmem_stream_t stream);

/* ---- Tags and pause ----------------------------------------------------
 *
 * A tag names memory that can be given back whole and taken again at the
 * same addresses: a model's weights, a KV cache. Allocations made on a thread
 * while a region is open there carry the region's tag; a tag's blocks come
 * from segments of that tag only. symmem_pause releases a tag's physical
 * memory (the address ranges stay reserved, pointers stay valid but must not
 * be touched while paused); symmem_resume maps new memory at the same
 * addresses. Pointers, tensors and captured CUDA graphs stay valid across a
 * cycle. Contents survive only with SYMMEM_REGION_BACKUP (a host copy, made
 * at pause, kept for the next cycle); WITHOUT BACKUP THE CONTENTS ARE ZERO
 * AFTER A RESUME. Untagged memory is never paused. Tags are process-wide,
 * never forgotten, 1 to 64 characters of letters, digits, '.', '_', '-'
 * (like group names). NULL means every tag where a function says so; THE
 * EMPTY STRING IS NOT EVERY TAG: it is INVALID_ARGUMENT at every entry
 * point (an unset string in a configuration must not pause all tagged
 * memory). Placement stays a function of the call sequence: the region
 * calls are part of it.
 *
 * A pinned backup is pinned ahead: when a segment of the tag is created, its
 * host copy is allocated (cuMemHostAlloc) in the background, so that the
 * first pause runs at copy speed; SYMMEM_BACKUP_PIN_AHEAD bounds the bytes
 * per device (default: a quarter of the host memory the process may use,
 * RAM or memory cgroup limit, divided among the machine's GPUs; 0: off, the
 * first pause pins). */

/* Region flags. */
#define SYMMEM_REGION_BACKUP 1u /* pause keeps a host copy; resume restores it */
/* With SYMMEM_REGION_BACKUP: the host copy is pageable anonymous memory
 * (the kernel may swap or reclaim it; copies are slower) instead of pinned. */
#define SYMMEM_REGION_BACKUP_PAGEABLE 2u
/* With SYMMEM_REGION_BACKUP: the host copy is an unlinked file of the
 * backup directory (symmem_set_backup_dir), mapped shared; the pause writes
 * it out and drops its pages from memory, the resume reads it back. */
#define SYMMEM_REGION_BACKUP_DISK 8u
/* With a NULL tag and no other flag: an untagged region, whose allocations
 * carry no tag whatever the outer regions and the default tag say. */
#define SYMMEM_REGION_UNTAGGED 4u
/* The tag's segments are mapped for their own GPU alone. Without it a
 * segment also grants read-write access to every other GPU that can reach
 * it directly, so that a copy between GPUs in this process (PyTorch's peer
 * copy kernels) can read it; that builds page tables on each such GPU at
 * every map and resume (on an H200, 4 GiB maps in about 1 ms for its own
 * GPU and 21 ms with one peer). torch_memory_saver's and vLLM's memory is
 * mapped this way, and so are the drop-ins' tags. Processes that import
 * the memory through a group are unaffected (each maps for its own GPU). */
#define SYMMEM_REGION_OWN_DEVICE 16u

/* Pause flags (symmem_pause_with): what this pause keeps, whatever the tag's
 * regions asked for. */
#define SYMMEM_PAUSE_DISCARD 1u /* no host copy: the resume zero-fills */
#define SYMMEM_PAUSE_KEEP 2u    /* a host copy even for a tag without backup (pinned) */

/* Opens a region of tag on the calling thread: until the matching
 * symmem_region_end, this thread's allocations (symmem_alloc, PyTorch's
 * through libsymmem) carry tag. Regions nest (16 deep per thread; the
 * innermost wins). flags: 0, SYMMEM_REGION_BACKUP, or SYMMEM_REGION_BACKUP |
 * SYMMEM_REGION_BACKUP_PAGEABLE or _DISK, each optionally with
 * SYMMEM_REGION_OWN_DEVICE; every region of a tag must pass the same
 * flags. symmem_region_begin(NULL, SYMMEM_REGION_UNTAGGED) opens an untagged
 * region. Returns INVALID_ARGUMENT for a bad, empty or NULL tag, unknown
 * flags, PAGEABLE without BACKUP, or flags that differ from the tag's; INVALID_STATE when 16
 * regions are open. The tag string is copied. Thread-safe (per thread). */
symmem_result symmem_region_begin(const char *tag, unsigned flags);

/* Sets the directory of disk backups (SYMMEM_REGION_BACKUP_DISK), made if
 * missing; NULL goes back to SYMMEM_BACKUP_DIR, else the temporary
 * directory. Use a disk, not a tmpfs (there the copy stays in memory).
 * INVALID_ARGUMENT for "" or a directory that cannot be made. */
symmem_result symmem_set_backup_dir(const char *path);

/* Sets the process's default tag: allocations made on any thread outside
 * every region carry tag (flags as for symmem_region_begin, the same for
 * every use of the tag); NULL (flags 0) clears it. Returns INVALID_ARGUMENT
 * as symmem_region_begin does. While a default tag is set, small untagged
 * allocations skip the thread caches. Thread-safe. */
symmem_result symmem_set_default_tag(const char *tag, unsigned flags);

/* Closes the calling thread's innermost region. INVALID_STATE when none is
 * open on this thread. */
symmem_result symmem_region_end(void);

/* Releases the physical memory of tag on every device (NULL: every tag not
 * yet paused). It waits for all of the device's work first, at most
 * SYMMEM_TIMEOUT_MS (on failure or timeout nothing is released), copies the contents to host memory if the tag asked
 * for backup (pinned where the backend has it), unmaps and releases; the
 * address ranges stay reserved. While paused: allocating in the tag fails
 * with INVALID_STATE; freeing its blocks is allowed (bookkeeping only);
 * symmem_empty_cache leaves paused segments alone (they hold no memory);
 * the memory must not be touched. Returns INVALID_ARGUMENT for the empty
 * string or a tag that no region ever opened, INVALID_STATE for a paused tag or one whose segments
 * were rendezvoused (use symmem_pause_group). Devices are taken in order:
 * an error on one leaves the devices before it paused (the message names the
 * device; symmem_resume takes them back, or symmem_pause again finishes the
 * rest: both act on the devices where the tag is in the state they change).
 * Thread-safe; not concurrently with allocations that use the tag. */
symmem_result symmem_pause(const char *tag);

/* symmem_pause with flags: 0 (as symmem_pause), SYMMEM_PAUSE_DISCARD or
 * SYMMEM_PAUSE_KEEP (not both: INVALID_ARGUMENT, as unknown flags). A host
 * copy made once is kept for later cycles whatever later pauses choose. */
symmem_result symmem_pause_with(const char *tag, unsigned flags);

/* The bytes of tag's segments on every device: *live mapped now, *paused
 * released by a pause (either pointer may be NULL). INVALID_ARGUMENT for
 * NULL, the empty string or a tag no region ever opened. Thread-safe. */
symmem_result symmem_tag_bytes(const char *tag, size_t *live, size_t *paused);

/* The host copy of [ptr, ptr + size) (within one segment): *host is its
 * address in the copy that the last pause of ptr's tag saved (valid until
 * the copy is given back: a resume with SYMMEM_RESUME_RELEASE_BACKUP, the
 * free that empties the segment, its release; it may change at the next
 * pause unless the last resume passed SYMMEM_RESUME_RETAIN_BACKUP), and *paused
 * (unless NULL) whether the segment is paused now (set also when the call
 * fails with INVALID_STATE, for memory of libsymmem without a copy). INVALID_STATE when there
 * is no such copy (the tag has no backup, the last pause discarded it, it
 * never paused, or the copy was given back); INVALID_POINTER for memory libsymmem did not allocate;
 * INVALID_ARGUMENT for a NULL host or a range past the segment. */
symmem_result symmem_backup_pointer(const void *ptr, size_t size, void **host, int *paused);

/* Takes back the memory of tag (NULL: every paused tag) at the same
 * addresses with the same access, and restores the backup (zero without
 * one). If memory runs out (the device or symmem_set_memory_limit), what was
 * mapped is undone, the tag stays paused, and OUT_OF_MEMORY names the tag and
 * the bytes: free memory and call again. INVALID_STATE for a tag that is not
 * paused, INVALID_ARGUMENT for the empty string or an unknown one.
 * Thread-safe. */
symmem_result symmem_resume(const char *tag);

/* Resume flags (symmem_resume_with). */
#define SYMMEM_RESUME_NO_FILL 1u /* leave memory without a host copy undefined, not zero */
/* Give the host copies back after restoring them (torch_memory_saver's and
 * vLLM's habit): symmem_backup_pointer then finds none. A pinned copy stays
 * allocated, empty, as the copy pinned ahead of the segment's next pause
 * while the bytes so held fit SYMMEM_BACKUP_PIN_AHEAD; other copies are
 * freed. */
#define SYMMEM_RESUME_RELEASE_BACKUP 2u
/* Keep the host copies at their addresses: symmem_backup_pointer gives the
 * same address after this resume and at the next pause (torch_memory_saver's
 * retain_cpu_backup). Without it or RELEASE_BACKUP a copy is kept but may
 * move at the next pause (to the copy pinned ahead once that has arrived). */
#define SYMMEM_RESUME_RETAIN_BACKUP 4u

/* symmem_resume with flags: 0 (as symmem_resume) or a combination of
 * SYMMEM_RESUME_NO_FILL, which skips the zero-fill of memory that has no
 * host copy (a pass over it at device bandwidth, about 1 ms for 4 GiB on
 * an H200): its contents are then whatever the new physical memory holds,
 * and one of SYMMEM_RESUME_RELEASE_BACKUP and SYMMEM_RESUME_RETAIN_BACKUP
 * (both, or unknown flags: INVALID_ARGUMENT). The memory of a segment in
 * which nothing is allocated any more holds nothing of use: its host copy is
 * freed at the free that empties it, whatever the flags. */
symmem_result symmem_resume_with(const char *tag, unsigned flags);

/* Collective symmem_pause for memory rendezvoused in group: every rank calls
 * it with the same tag (NULL: every tag; the empty string: INVALID_ARGUMENT). Every rank drops its mappings of
 * the peers' segments of the tag (so the memory really returns) and releases
 * its own; handles keep their pointers. Signal pads are never paused. Every
 * rank gets the same result: before anything is released the ranks check
 * that the tag is live everywhere with the same segments (INVALID_STATE,
 * INVALID_ARGUMENT or MISMATCH otherwise, nothing done). It runs in two
 * phases: first every rank does what can fail without releasing anything
 * (waits for the device, makes the host copies: a failed synchronisation,
 * host memory or disk short), and the ranks share the verdict; a failure
 * there, on any rank, fails every rank with every buffer still live, mapped
 * and usable, and the next pause starts afresh. Only then do the ranks drop
 * their mappings and release, segment by segment, each segment's NCCL
 * window deregistered just before its memory goes. What can still fail then
 * is the driver refusing an unmap or a release (leaked), or NCCL refusing a
 * window deregistration (that window stays registered): the segments not
 * yet released stay mapped, with their windows, and the error, the same on
 * every rank, says what the failing rank holds. The tag then counts as
 * paused on every rank (in part on that one): symmem_pause_group again is
 * INVALID_STATE, and symmem_resume_group on every rank takes every rank
 * back to the resumed state, windows registered again; pause again after
 * it. A segment whose unmap failed after its window went is mapped without
 * a window until that resume (symmem_handle_nccl_window says so). A peer that
 * dies before the release phase leaves everything as it was (PEER or
 * TIMEOUT naming it, within the group's timeout); after it, this rank's part
 * is done and its tag is paused (symmem_resume takes it back locally). */
symmem_result symmem_pause_group(symmem_group *group, const char *tag);

/* Collective symmem_resume (same tags as symmem_pause_group): every rank takes its memory back, then the ranks
 * pass descriptors of the new memory over the group's IPC channel and map
 * the peers' segments at the same addresses as before. Any rank's failure
 * (e.g. OUT_OF_MEMORY, naming that rank, the tag and the bytes) is every
 * rank's, and every rank is left paused, ready for a retry. */
symmem_result symmem_resume_group(symmem_group *group, const char *tag);

/* ---------------------------------------------------------------------------
 * Collectives on symmetric memory
 *
 * Every rank of the handle's group calls the same collective with the same
 * dtype, op, count and algorithm, in the same order. The input is count
 * elements at the handle's rendezvous pointer of every rank (the block plus
 * symmem_handle_offset); out is this rank's output (any memory of the device,
 * or the same block). W = world size, r = this rank:
 *
 *   all_reduce      writes count elements to out (NULL: in place, out = the
 *                   input): the reduction over ranks, in rank order 0..W-1,
 *                   accumulated in fp32 for bf16/fp16 and rounded once to
 *                   nearest even (the same on every rank and every run), int32
 *                   wrapping.
 *   all_gather      writes W*count elements to out, rank p's input at p*count.
 *                   In place when out + r*count elements is the input.
 *   reduce_scatter  count must be a multiple of W; writes count/W elements to
 *                   out: the reduction of slice r (elements [r*count/W,
 *                   (r+1)*count/W)). In place when out is slice r of the input.
 *
 * All-reduce runs one-shot (every rank reads every rank's whole input),
 * two-shot (rank r reduces slice r, then every rank's out gets every
 * reduced slice, stored into the peers' outs below 8 MiB, read from them
 * from 8 MiB on: out must then lie inside the rendezvoused block, at the
 * same offset on every rank; in place qualifies) or low-latency (every
 * rank stores its data into every peer's low-latency buffer as lines that
 * carry the call's sequence number, and polls its own: one crossing of
 * NVLink, no barrier; channel 0, up to SYMMEM_LL_MAX_BYTES, 256 KiB by
 * default, of data per rank and peer; all_gather and reduce_scatter take
 * it too, for a multiple of 8 bytes per rank and peer). SYMMEM_ALGO_AUTO
 * picks low-latency wherever it fits on the cuda backend; otherwise
 * one-shot up to 256 KiB of input, on 2 ranks up to 1 MiB in place
 * (SYMMEM_ONE_SHOT_MAX_BYTES overrides both), when out is outside the
 * block, and on 2 ranks whenever out is not in place; two-shot otherwise.
 * Low-latency results are those of one-shot, bit for bit.
 *
 * cuda backend: one kernel, compiled at first use with NVRTC (found as
 * SYMMEM_LIBNVRTC, PyTorch's nvidia-cuda-nvrtc wheel or the CUDA toolkit) and
 * cached on disk (docs/design.md, "Collectives and kernels"), enqueued on stream and returning at once; capturable
 * in CUDA graphs; it waits for its peers on the GPU with the counting
 * barriers of include/symmem_device.cuh, bounded by the group's timeout (a
 * wait that gives up records the flag symmem_handle_device_error reads).
 * Collectives that may run at once on one group (different streams) need
 * different channels (symmem_collective); the library's collectives never
 * touch the signal channels of symmem_put_signal / symmem_wait_signal.
 * host backend: they run on the calling thread and return when done
 * (SYMMEM_ERROR_TIMEOUT after the group's timeout, naming the missing rank;
 * SYMMEM_ERROR_PEER within about 10 ms when a peer's process exits, naming
 * its rank, pid and exit status).
 *
 * Every rank compares every peer's (collective, dtype, op, count, resolved
 * algorithm) with its own at the call's opening barrier, before any data
 * moves (docs/diagnostics.md): on the host backend a difference is
 * SYMMEM_ERROR_MISMATCH on every rank naming every rank's call, nothing
 * moved, the group still usable; on cuda the kernel returns without touching
 * out and the device error flag records the mismatch
 * (symmem_handle_device_error).
 *
 * A group whose ranks are on several machines (symmem_group_local_size <
 * world_size) runs all_reduce in one of two forms, on stream, with no host
 * synchronisation:
 *   SYMMEM_ALGO_NCCL          the whole collective on its NCCL communicator
 *                             (ncclAllReduce with the call's dtype and op,
 *                             reading the input in the block, which the
 *                             rendezvous registered as an NCCL window);
 *   SYMMEM_ALGO_HIERARCHICAL  a reduce-scatter inside each machine with the
 *                             library's own collective, an all-reduce of each
 *                             slice across machines through NCCL on a
 *                             communicator split by local rank (made by the
 *                             first such call, destroyed with the group), an
 *                             all-gather inside each machine. It needs every
 *                             machine to hold the same number of ranks and
 *                             out inside the rendezvoused block (in place
 *                             qualifies), else SYMMEM_ERROR_UNAVAILABLE /
 *                             SYMMEM_ERROR_INVALID_ARGUMENT naming the reason.
 * SYMMEM_ALGO_AUTO picks hierarchical when it can run, the machines hold 2
 * or more ranks each and the input is at least SYMMEM_HIER_MIN_BYTES (4 MiB;
 * a modelled threshold, docs/machines.md); NCCL otherwise (ONE_SHOT and
 * TWO_SHOT mean NCCL there). Reduction order: NCCL's across machines; with
 * hierarchical, local rank order inside each machine first. Results equal
 * one machine's for int32, max and min; for float sums up to rounding.
 * all_gather and reduce_scatter run whole on NCCL whatever algo says. A
 * CUDA graph capturing the hierarchical form is made after one such call
 * (the split is a host-side collective). On one machine HIERARCHICAL and
 * NCCL are AUTO. Without a communicator (a group of
 * symmem_group_create_with_allgather) a collective is
 * SYMMEM_ERROR_UNAVAILABLE naming the missing engine. docs/machines.md.
 *
 * After a failure the group's collectives stop (fail-stop, as NCCL asks for
 * a new communicator after a timeout; docs/diagnostics.md, "A collective
 * timed out"). A collective whose wait gives up on any rank (a timeout, a
 * peer's exit, an abort; on cuda also a mismatch) leaves the ranks'
 * barrier counts out of step: a late peer would find the arrival of the
 * rank that left and go on with inputs of a later call. So the rank that
 * gives up marks the group's collectives stopped in its own device region
 * and in every peer's of its machine, and from then on every collective on
 * the group, on every channel and every rank of that machine, fails at
 * once with SYMMEM_ERROR_INVALID_STATE, nothing enqueued, the message naming
 * the first failure (which rank gave up, waiting for which rank, on which
 * channel and kernel block) and what to do: abort the group
 * (symmem_group_abort), destroy it and create a new one. On the host
 * backend a wait of a peer that is still in the call ends at once (on cuda
 * a kernel's wait ends at its own timeout). The failed call itself returns
 * its own error on the host backend (SYMMEM_ERROR_TIMEOUT, _PEER, ...); a
 * late peer's call fails. On cuda a call returns once its kernel is
 * enqueued: the failure of a kernel shows at the next call on the group
 * after the kernel gave up (the check reads a word of pinned host memory
 * that the kernel writes: no device synchronisation), and every kernel of
 * the group that starts after the failure, enqueued before or replayed in
 * a CUDA graph, returns at once without touching out. A graph replay has no
 * host-side entry in the library: a failed replay shows at the next call of
 * the library on the group (or symmem_handle_device_error). What the call
 * that failed (or a late peer's call that passed its start just before its
 * peer gave up) wrote to out is undefined. On a group that spans machines
 * the same holds for the steps inside each machine; ranks on other
 * machines learn of it through their own waits (NCCL's timeouts).
 *
 * Errors, with nothing enqueued: SYMMEM_ERROR_INVALID_ARGUMENT for an unknown
 * dtype, op, algorithm or channel, SYMMEM_ALGO_LOW_LATENCY for a call it
 * cannot run (the message says why), count past the buffer (count*size >
 * buffer_size - offset), a count that reduce_scatter cannot split, an input or
 * out not 16-byte aligned, out NULL (all_gather, reduce_scatter), out
 * overlapping the input other than in place, two-shot with out outside the
 * block (also hierarchical, above); SYMMEM_ERROR_INVALID_STATE for a released
 * handle and for a group whose collectives stopped (above);
 * SYMMEM_ERROR_UNAVAILABLE when NVRTC cannot be found (the message names what
 * to install). count 0 does nothing. Thread safety: calls on different
 * channels may run at once; calls on one channel must be ordered (one
 * stream, or streams the caller orders). */

/* Element types. Fixed values. */
typedef enum symmem_dtype {
  SYMMEM_FLOAT32 = 0,
  SYMMEM_FLOAT16 = 1,
  SYMMEM_BFLOAT16 = 2,
  SYMMEM_INT32 = 3
} symmem_dtype;

/* Reductions. Fixed values. max/min follow fmaxf/fminf (a NaN operand
 * yields the other). */
typedef enum symmem_op {
  SYMMEM_SUM = 0,
  SYMMEM_MAX = 1,
  SYMMEM_MIN = 2
} symmem_op;

/* Which collective symmem_collective runs. Fixed values. */
typedef enum symmem_coll {
  SYMMEM_ALL_REDUCE = 0,
  SYMMEM_ALL_GATHER = 1,
  SYMMEM_REDUCE_SCATTER = 2,
  SYMMEM_ALL_TO_ALL = 3
} symmem_coll;

/* Algorithms. Fixed values. HIERARCHICAL and NCCL choose between the two
 * forms on a group that spans machines (see above); on one machine they are
 * AUTO. LOW_LATENCY (any collective, channel 0, up to
 * SYMMEM_LL_MAX_BYTES of data per rank and peer; on the host backend it
 * runs as ONE_SHOT) moves each rank's data into the peers' low-latency
 * buffers as lines that carry the call's sequence number, with no barrier:
 * one NVLink crossing per call (docs/speed.md).
 * COPY_ENGINE (a group of one machine; INVALID_ARGUMENT on one that spans
 * machines) moves the bytes with the GPUs' copy engines, leaving the SMs
 * to other work: all_gather and all_to_all (equal splits, through
 * symmem_collective; the v forms refuse it) pull every peer's chunk with
 * one copy and launch no kernel, their barriers being stream memory
 * operations on the pads; reduce_scatter and all_reduce pull the peers'
 * chunks into a scratch of this rank's (device memory the library keeps,
 * growing to the largest call, for the process's life) and reduce them
 * with a small kernel: one-shot's results, bit for bit. Capturable in
 * CUDA graphs (make one call of the largest size before capturing: it
 * makes the scratch; a reduction captured before then is
 * SYMMEM_ERROR_INVALID_STATE, nothing enqueued). The GPU does not bound a stream's wait: an
 * uncaptured call that has not finished within the group's timeout is
 * failed by the library from the host (the group's collectives stop,
 * the next call returns SYMMEM_ERROR_INVALID_STATE naming a peer that never
 * arrived or one that called with other arguments, and the stream is
 * released; a late peer's call waits in its turn and fails naming the rank
 * that gave up); a replay of a captured call is not watched (one that a
 * peer never answers blocks its stream, which symmem_group_abort does not
 * release). On the host
 * backend the copies are memcpy and the argument agreement is the
 * collectives' own. AUTO picks it for every call of a group of one machine
 * when SYMMEM_LEAVE_SMS=1. docs/speed.md, "Collectives on the copy
 * engines". */
typedef enum symmem_algo {
  SYMMEM_ALGO_AUTO = 0,
  SYMMEM_ALGO_ONE_SHOT = 1,
  SYMMEM_ALGO_TWO_SHOT = 2,
  SYMMEM_ALGO_HIERARCHICAL = 3,
  SYMMEM_ALGO_NCCL = 4,
  SYMMEM_ALGO_LOW_LATENCY = 5,
  SYMMEM_ALGO_COPY_ENGINE = 6
} symmem_algo;

/* The number of collective channels (symmem_collective's channel is in
 * [0, SYMMEM_COLL_CHANNELS)). */
#define SYMMEM_COLL_CHANNELS 4

/* all_reduce on channel 0 with SYMMEM_ALGO_AUTO. out NULL: in place. */
symmem_result symmem_all_reduce(symmem_handle *handle, symmem_dtype dtype,
                                symmem_op op, size_t count, void *out,
                                symmem_stream_t stream);
/* all_gather on channel 0: count elements of each rank's input, W*count to
 * out. */
symmem_result symmem_all_gather(symmem_handle *handle, symmem_dtype dtype,
                                size_t count, void *out,
                                symmem_stream_t stream);
/* reduce_scatter on channel 0: count elements of each rank's input (a
 * multiple of W), count/W to out. */
symmem_result symmem_reduce_scatter(symmem_handle *handle, symmem_dtype dtype,
                                    symmem_op op, size_t count, void *out,
                                    symmem_stream_t stream);
/* Any of the three with every choice: algo (all_reduce only; others take
 * SYMMEM_ALGO_AUTO) and channel in [0, SYMMEM_COLL_CHANNELS). op is ignored
 * by all_gather. */
symmem_result symmem_collective(symmem_handle *handle, symmem_coll coll,
                                symmem_dtype dtype, symmem_op op, size_t count,
                                void *out, symmem_algo algo, int channel,
                                symmem_stream_t stream);

/* symmem_collective with this rank's input at in instead of the handle's
 * rendezvous pointer: any memory of the handle's device, 16-byte aligned
 * (NULL or the rendezvous pointer: symmem_collective itself). Only the
 * low-latency path reads nothing but this rank's own input, so such a call
 * runs there; the handle then serves for its group's pads only, and its
 * block is neither read nor written. all_reduce, all_gather and
 * reduce_scatter; algo SYMMEM_ALGO_AUTO or SYMMEM_ALGO_LOW_LATENCY;
 * channel 0; at most symmem_low_latency_max_bytes(handle) bytes per rank
 * and peer (all_reduce and all_gather: count elements; reduce_scatter:
 * count/W), a multiple of 8 for all_gather and reduce_scatter. Anything
 * else is refused with SYMMEM_ERROR_INVALID_ARGUMENT, naming why, and
 * nothing runs: then copy the input to the rendezvous pointer and call
 * symmem_collective. all_reduce's out NULL: in place at in. Every rank's
 * call must be the same collective with the same count, as always; where
 * each rank's input lies is its own. */
symmem_result symmem_collective_from(symmem_handle *handle, symmem_coll coll,
                                     symmem_dtype dtype, symmem_op op,
                                     size_t count, const void *in, void *out,
                                     symmem_algo algo, int channel,
                                     symmem_stream_t stream);

/* The most bytes per rank and peer that the handle's group runs on the
 * low-latency path (SYMMEM_LL_MAX_BYTES), so the most that
 * symmem_collective_from takes; 0 where the group has none: the host
 * backend, a group that spans machines, groups larger than the
 * low-latency buffers serve, SYMMEM_LL_MAX_BYTES=0, or a bad handle. */
size_t symmem_low_latency_max_bytes(symmem_handle *handle);

/* ---------------------------------------------------------------------------
 * All-to-all (expert parallelism)
 *
 * The input is at the handle's rendezvous pointer of every rank, as for the
 * collectives above; out is this rank's output (any memory of its device:
 * every rank reads its peers' inputs and writes only its own out, so out
 * need not be symmetric). Every call is one kernel on stream (cuda,
 * capturable in CUDA graphs, no host synchronisation anywhere) or runs on
 * the calling thread (host backend), with the collectives' opening barrier
 * and argument agreement, closing barrier, timeout and abort word. They use
 * collective channel 0: order them with the other collectives of channel 0,
 * and run one all-to-all of a group at a time.
 *
 * symmem_all_to_all: equal splits. Each rank's input is W*count elements,
 * chunk p (elements [p*count, (p+1)*count)) for rank p; out receives W*count
 * elements, rank p's chunk for us at p*count. Also symmem_collective with
 * SYMMEM_ALL_TO_ALL (op is ignored, and algo but SYMMEM_ALGO_COPY_ENGINE,
 * which runs it on the copy engines; channel as there).
 *
 * The v forms: split sizes are read from device memory when the kernel runs
 * (an MoE router computes them on the GPU), counted in rows of row_bytes
 * bytes; the sizes and offsets each rank receives are written to device
 * memory. Any split size works (0 included). They take the arguments and
 * give the results of torch 2.11's torch.ops.symm_mem.all_to_all_vdev,
 * all_to_all_vdev_2d and all_to_all_vdev_2d_offset, with E = experts per
 * rank and S = W*E splits:
 *
 *   symmem_all_to_all_v          in_splits[p] rows for rank p, taken from
 *                                the input in rank order (offsets: the
 *                                exclusive prefix sum); out receives rank
 *                                s's rows at out_splits_offsets[W + s], in
 *                                rank order, out_splits_offsets[s] of them.
 *   symmem_all_to_all_v_2d       dispatch: in_splits[p*E + e] rows for local
 *                                expert e of rank p, taken in that order;
 *                                out groups what arrives by our expert:
 *                                index i = e*W + s (expert e, source rank s)
 *                                in out_splits_offsets[i] (rows) and
 *                                out_splits_offsets[S + i] (row offset);
 *                                each expert's rows start at a multiple of
 *                                major_align (> 0; 1: packed), and an
 *                                expert that receives nothing still takes
 *                                major_align rows (torch's rule, for grouped
 *                                GEMMs that refuse empty groups).
 *   symmem_all_to_all_v_2d_offset combine, the reverse of the dispatch:
 *                                in_splits_offsets is 2 x S, index i = e*W + p
 *                                (rows for source rank p's expert e, as the
 *                                dispatch gave them: splits in row 0, row
 *                                offsets into the input in row 1, padding
 *                                between them not sent); out receives, in
 *                                rank-major order i = p*E + e, the rows that
 *                                rank p's expert e sends back, packed.
 *
 * out has room for out_rows rows. A call is refused on the device, with
 * nothing written to out, when a rank's splits are bad (a negative split
 * or offset, or rows past its input: the block from the rendezvous
 * offset; an empty split's offset is not looked at): on every rank, naming
 * that sender; or when the rows a rank receives, as laid out (a dispatch's
 * padding included), pass its out_rows: on that rank alone, naming it.
 * out_splits_offsets still holds what the receiver was sent, and the
 * device error flag records cause 3 with SYMMEM_DEV_OVERRUN_SET_BIT and
 * the rank named
 * (symmem_handle_device_error returns SYMMEM_ERROR_INVALID_ARGUMENT for
 * it); the host backend returns SYMMEM_ERROR_INVALID_ARGUMENT naming it.
 * Ranks must agree on the form, row_bytes, experts, out_rows and
 * major_align (the argument agreement compares them). S <= 1024.
 * Errors with nothing enqueued: SYMMEM_ERROR_INVALID_ARGUMENT for a
 * row_bytes of 0, experts < 1, S > 1024, major_align < 1, NULL pointers,
 * in_splits not 8-byte aligned; SYMMEM_ERROR_INVALID_STATE for a released
 * handle; SYMMEM_ERROR_UNAVAILABLE on a group that spans machines without
 * an engine between them (symmem_group_create_with_allgather), naming it.
 *
 * Across machines (a group over an NCCL communicator whose ranks are on
 * several machines, docs/machines.md), every form is one call with the
 * results above; the rows for ranks of other machines travel through NCCL
 * (ncclSend / ncclRecv between ncclGroupStart and ncclGroupEnd on the
 * group's communicator, on stream), none through the library itself.
 * symmem_all_to_all stays stream-ordered with no host synchronisation and
 * capturable (after one call outside the capture, as NCCL's own
 * point-to-point calls need): where this rank's machine holds consecutive
 * ranks (the usual launch, ranks numbered machine by machine), the chunks
 * among them move through the mapped memory as on one machine (one kernel
 * over the machine's ranks, with their agreement and barriers) and the
 * remote chunks through NCCL; on other layouts every chunk goes through
 * NCCL, which moves a machine's chunks over its own NVLink or shared-memory
 * paths. Nothing compares symmem_all_to_all's dtype and count across
 * machines (NCCL takes what each rank passes, as for the nccl form of the
 * collectives above); the ranks of a machine compare theirs as on one
 * machine. The v forms need each transfer's size on the host, so each call
 * synchronises with it: two NCCL all-gathers (the arguments, then every
 * rank's split table) copied to the host, out_splits_offsets copied back,
 * every row through NCCL (this machine's too: the layouts interleave its
 * rows with the other machines'), with five waits for the stream per call
 * (each bounded by the group's timeout: SYMMEM_ERROR_TIMEOUT naming the
 * ranks of the other machines), and no CUDA graph capture (the driver
 * refuses a wait inside a capture: the call fails, and the capture with
 * it). The refusals are the host's there,
 * before any row moves, as error returns rather than device flags: ranks
 * with different arguments all get SYMMEM_ERROR_MISMATCH naming every
 * rank's; a negative split or one past its input fails every rank with
 * SYMMEM_ERROR_INVALID_ARGUMENT naming the sender, out_splits_offsets
 * untouched; a receiver whose rows would pass out_rows gets
 * SYMMEM_ERROR_INVALID_ARGUMENT naming it, out untouched and
 * out_splits_offsets written, while the other ranks receive theirs. */
symmem_result symmem_all_to_all(symmem_handle *handle, symmem_dtype dtype,
                                size_t count, void *out,
                                symmem_stream_t stream);
symmem_result symmem_all_to_all_v(symmem_handle *handle, size_t row_bytes,
                                  const int64_t *in_splits, void *out,
                                  size_t out_rows, int64_t *out_splits_offsets,
                                  symmem_stream_t stream);
symmem_result symmem_all_to_all_v_2d(symmem_handle *handle, size_t row_bytes,
                                     int experts, const int64_t *in_splits,
                                     void *out, size_t out_rows,
                                     int64_t *out_splits_offsets,
                                     int64_t major_align,
                                     symmem_stream_t stream);
symmem_result symmem_all_to_all_v_2d_offset(symmem_handle *handle,
                                            size_t row_bytes, int experts,
                                            const int64_t *in_splits_offsets,
                                            void *out, size_t out_rows,
                                            int64_t *out_splits_offsets,
                                            symmem_stream_t stream);

/* ---------------------------------------------------------------------------
 * All-reduce with RMSNorm (tensor parallelism: the end of a decode layer)
 *
 * The input x is tokens rows of hidden elements at the handle's rendezvous
 * pointer of every rank, as for all_reduce; residual (tokens x hidden, read
 * and written) and weight (hidden elements) are this rank's memory of its
 * device, all of dtype (SYMMEM_BFLOAT16, SYMMEM_FLOAT16 or SYMMEM_FLOAT32).
 * With round() rounding fp32 to dtype, to nearest even:
 *
 *   a        = all_reduce(x)      as symmem_all_reduce with SYMMEM_SUM: fp32
 *                                 sums in rank order, rounded once
 *   residual = round(a + residual)              one fp32 add
 *   inv      = 1 / sqrt(sum(residual^2) / hidden + eps)   per row, in fp32
 *   out      = round((residual * inv) * weight)           two fp32 products
 *
 * Every fp32 operation is rounded on its own (no fused multiply-add; IEEE
 * division and square root) and the row's sum of squares runs in a fixed
 * order (docs/tensor-parallel.md, "Rounding"): the results are the same bits
 * on every rank, on every run, on the cuda and the host backends.
 *
 * out NULL: in place (out = the input). Otherwise out overlaps none of the
 * input, residual and weight; residual overlaps none of the input, out and
 * weight. hidden is a multiple of 8 in [8, 16384]; pointers are 16-byte
 * aligned; eps is finite and >= 0. algo: SYMMEM_ALGO_AUTO runs one kernel on
 * the low-latency path when tokens * hidden elements fit SYMMEM_LL_MAX_BYTES
 * (cuda, one machine: each block owns whole rows, and norms them as soon
 * as their lines have arrived), else the all-reduce as symmem_all_reduce's
 * AUTO would run it into out, then one kernel that adds and norms;
 * SYMMEM_ALGO_LOW_LATENCY insists on the one kernel (INVALID_ARGUMENT
 * naming why when it cannot run; on the host backend the same results);
 * ONE_SHOT and TWO_SHOT choose the all-reduce of the two-kernel form.
 * Collective channel 0: order it with the other collectives there. Every
 * rank passes the same dtype, tokens and hidden (the argument agreement
 * compares them as for all_reduce); residual, weight and eps are each
 * rank's own. Capturable in CUDA graphs. Errors with nothing enqueued:
 * SYMMEM_ERROR_INVALID_ARGUMENT for an int32 or unknown dtype, an unknown
 * algorithm, hidden or eps out of range, NULL or misaligned pointers,
 * overlaps, rows past the buffer, and what symmem_all_reduce refuses;
 * SYMMEM_ERROR_INVALID_STATE for a released handle. tokens 0 does
 * nothing. */
symmem_result symmem_all_reduce_rmsnorm(symmem_handle *handle,
                                        symmem_dtype dtype, size_t tokens,
                                        size_t hidden, void *residual,
                                        const void *weight, float eps,
                                        void *out, symmem_algo algo,
                                        symmem_stream_t stream);

/* symmem_all_reduce_rmsnorm with this rank's input x at in instead of the
 * handle's rendezvous pointer: any memory of the handle's device, 16-byte
 * aligned (NULL or the rendezvous pointer: symmem_all_reduce_rmsnorm
 * itself). Only the fused low-latency call reads nothing but this rank's
 * own input, so such a call must be one: at most
 * symmem_low_latency_max_bytes(handle) bytes of x, a group of two or more
 * ranks on one machine, algo SYMMEM_ALGO_AUTO or SYMMEM_ALGO_LOW_LATENCY;
 * anything else is refused with SYMMEM_ERROR_INVALID_ARGUMENT, naming why,
 * and nothing runs. out NULL: in place at in. */
symmem_result symmem_all_reduce_rmsnorm_from(symmem_handle *handle,
                                             symmem_dtype dtype, size_t tokens,
                                             size_t hidden, const void *in,
                                             void *residual, const void *weight,
                                             float eps, void *out,
                                             symmem_algo algo,
                                             symmem_stream_t stream);

/* Reads this rank's device error flag (the library's part of its signal pad,
 * include/symmem_device.cuh) into *flag: 0 while every kernel wait
 * succeeded, else 0x80000000 | cause << 29 | peer << 16 | set of the first
 * failure (the kernel's results are then undefined; use another group).
 * Returns SYMMEM_SUCCESS for 0 and for a timeout (cause 0: the flag names
 * the peer waited for), SYMMEM_ERROR_MISMATCH when peer called a collective
 * with other arguments (cause 1; out was left untouched),
 * SYMMEM_ERROR_PEER when peer's process exited during a wait (cause 2) and
 * SYMMEM_ERROR_INVALID_STATE when a wait gave up because rank peer's
 * collective had given up (cause 3: the group's collectives stopped; but
 * SYMMEM_ERROR_MISMATCH when peer gave up on other collective arguments,
 * bits 12-13 of the set field 1: which rank's kernel sees a mismatch first
 * is a race, and every rank reports it alike),
 * SYMMEM_ERROR_INVALID_ARGUMENT when an all-to-all was refused for rank
 * peer's splits or out (cause 3 with bit 15 of the set field,
 * SYMMEM_DEV_OVERRUN_SET_BIT; out was left untouched), the
 * last error naming the rank; *flag is filled in every case. A collective
 * failure need not be polled for: once a collective's wait gave up, every
 * later collective on the group fails by itself (see the collectives
 * above). The flag also records the stream signals' waits that gave up
 * (set 0xffff), which stop nothing: a stream wait's number is taken when it
 * is enqueued, so the counts stay in step, but the work enqueued after it
 * ran without the signal. On cuda a copy
 * from the device on the library's own non-blocking stream, ordered after
 * nothing (synchronise the collectives' streams first to see what their
 * kernels recorded) and never behind the caller's streams, even a stuck
 * one: it waits at most the group's timeout, then fails with
 * SYMMEM_ERROR_TIMEOUT (*flag 0). Works on an aborted group too. */
symmem_result symmem_handle_device_error(const symmem_handle *handle,
                                         uint32_t *flag);

/* How the collectives' kernels were obtained for a device. */
typedef struct symmem_kernel_info {
  int arch;          /* compute capability, major*10 + minor (90: H100/H200) */
  int from_cache;    /* 1: the image came from the disk cache */
  double compile_ms; /* NVRTC's compile time (0 when from the cache) */
  double load_ms;    /* reading the cache file and cuModuleLoadData */
  char compiler[256];   /* "NVRTC 13.0 (/path/libnvrtc.so.13)" */
  char cache_path[512]; /* the cache folder, "" when the cache is off */
} symmem_kernel_info;

/* Compiles (or reads from the cache) and loads the collectives' kernels for
 * device now rather than at the first collective (which does the same), and
 * fills *info (may be NULL). Later calls return the first call's info. The
 * kernels are compiled with NVRTC for the device's architecture and cached in
 * $SYMMEM_CACHE_DIR/kernels or the user's cache directory
 * (~/.cache/libsymmem/kernels), keyed by source hash, architecture and NVRTC
 * version; a cache file whose checksum fails is rebuilt. The host backend has
 * nothing to compile: success with a zeroed info. SYMMEM_ERROR_UNAVAILABLE
 * without NVRTC (the message names what to install); SYMMEM_ERROR_BACKEND
 * when compiling or loading fails (the message holds NVRTC's log).
 * Thread-safe. */
symmem_result symmem_collectives_load(int device, symmem_kernel_info *info);

/* ---------------------------------------------------------------------------
 * Groups over an NCCL communicator, NCCL symmetric windows
 *
 * NCCL is never linked: it is loaded at run time the first time one of these
 * functions needs it (a process that never calls them never loads it): the
 * NCCL already loaded in the process (PyTorch loads one), else the path in
 * SYMMEM_LIBNCCL, else libnccl.so.2 through the dynamic linker, in the
 * nvidia-nccl wheel's folder (site-packages/nvidia/nccl/lib) and in the CUDA
 * toolkit. NCCL 2.28 or newer is needed (window registration); with 2.29 or
 * newer each rendezvous also checks NCCL's host peer pointers. A missing or
 * too old NCCL is SYMMEM_ERROR_UNAVAILABLE, saying what was found and what is
 * needed. NCCL errors carry NCCL's own text (ncclGetErrorString and
 * ncclGetLastError).
 *
 * Example (one rank; comm made by ncclCommInitRank or taken from PyTorch's
 * ProcessGroupNCCL, on the device this rank's buffers live on):
 *
 *     symmem_group *g;
 *     if (symmem_group_create_nccl(comm, "tp", 60000, 0, &g) != SYMMEM_SUCCESS)
 *       fprintf(stderr, "%s\n", symmem_last_error_message());
 *     void *buf = symmem_alloc(bytes, symmem_group_device(g), stream);
 *     symmem_handle *h;
 *     symmem_rendezvous(buf, g, &h);           // registers the window
 *     ncclAllReduce(buf, buf, n, ncclBfloat16, ncclSum, comm, stream);
 *                                              // NCCL's symmetric path
 *     ...
 *     symmem_handle_release(h);
 *     symmem_free(buf, bytes, symmem_group_device(g), stream);
 *     symmem_group_destroy(g);                 // before ncclCommDestroy
 * ------------------------------------------------------------------------- */

/* Flags of symmem_group_create_nccl. */
#define SYMMEM_NCCL_NO_WINDOWS 1u /* rendezvous registers no NCCL window */

/* Creates this process's member of group name over nccl_comm, an ncclComm_t
 * that the caller owns and keeps alive until symmem_group_destroy returns
 * (libsymmem never destroys or aborts it). Collective over the communicator:
 * every rank calls it. Rank, world size and device are the communicator's
 * (ncclCommUserRank, ncclCommCount, ncclCommCuDevice). The group's small
 * records are all-gathered with ncclAllGather on a private stream through a
 * small device staging buffer; file descriptors still travel over the Unix
 * socket channel (one node). timeout_ms bounds every wait (0:
 * SYMMEM_TIMEOUT_MS or 300000; negative: SYMMEM_ERROR_INVALID_ARGUMENT): when an NCCL collective does not finish in
 * time (a dead or absent rank) the call fails with SYMMEM_ERROR_TIMEOUT, the
 * group can no longer be used (destroy it), and the communicator is left to
 * its owner, who should abort it (ncclCommAbort).
 *
 * Unless flags has SYMMEM_NCCL_NO_WINDOWS, every symmem_rendezvous on the
 * group registers the segment holding the buffer (whole segments: cuMem
 * memory with POSIX-fd handles, granularity-aligned) as an NCCL symmetric
 * window (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC), collectively,
 * once per (segment, group); later rendezvous on the same segment make no
 * NCCL call. NCCL collectives on buffers in registered segments then take
 * NCCL's symmetric-memory path. A window is deregistered before its segment's
 * memory is released (symmem_empty_cache, out-of-memory retries) or when the
 * group is destroyed, whichever comes first, and never twice. The group makes
 * its first NCCL calls (all-gathers) before any registration, which avoids
 * pytorch issue 188567 (registration as the first NCCL operation on a
 * communicator fails).
 *
 * Returns SYMMEM_ERROR_INVALID_ARGUMENT (NULL comm, name or out, unknown
 * flags), SYMMEM_ERROR_UNAVAILABLE (no usable NCCL), SYMMEM_ERROR_TIMEOUT,
 * SYMMEM_ERROR_MISMATCH, or an NCCL failure with NCCL's text. On success *out
 * owns the group. Thread safety: as symmem_group_create. */
symmem_result symmem_group_create_nccl(void *nccl_comm, const char *name,
                                       int64_t timeout_ms, unsigned flags,
                                       symmem_group **out);

/* Loads NCCL (see above) and returns its version as ncclGetVersion reports
 * it (22809 for 2.28.9), or 0 with the last error SYMMEM_ERROR_UNAVAILABLE
 * saying what was found and what is needed. Thread-safe. */
int symmem_nccl_version(void);

/* The current NCCL window (an ncclWindow_t) holding handle's buffer on this
 * rank and the rendezvous pointer's offset in it, for NCCL calls that take
 * windows. The window is owned by the group and stays valid while the
 * buffer is allocated, the group lives and the buffer's tag is not paused:
 * a collective pause deregisters it with the memory (only once every rank
 * has agreed to pause, so a pause that fails before that leaves it
 * registered) and the resume registers a new one, which this call then
 * returns; do not keep a window across a pause. SYMMEM_ERROR_INVALID_STATE
 * (and *window = NULL) while the tag is paused, and on a segment that a
 * pause failing in its release phase left mapped without its window (the
 * message says so; symmem_resume_group on every rank registers it again);
 * SYMMEM_ERROR_UNAVAILABLE when the handle's group
 * is not over a communicator or was created with SYMMEM_NCCL_NO_WINDOWS.
 * offset may be NULL. Thread-safe. */
symmem_result symmem_handle_nccl_window(const symmem_handle *handle,
                                        void **window, size_t *offset);

/* How many windows group has registered and deregistered so far and how
 * many it holds now (each pointer may be NULL); all 0 for a group without
 * windows. For tests and monitoring. Thread-safe. */
symmem_result symmem_group_nccl_window_counts(const symmem_group *group,
                                              int64_t *registered,
                                              int64_t *deregistered,
                                              int64_t *live);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SYMMEM_H */
