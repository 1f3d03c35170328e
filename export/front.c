// The C fronts of every public function that enters Go (Note [The C front],
// front.h). The prototypes come from include/symmem.h, so the compiler checks
// each front against the contract.
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "internal.h"
#include "front.h"

volatile int symmemi_forked;

static void symmemi_on_fork_child(void) { symmemi_forked = 1; }

// Registered when the library is loaded, before any call can enter Go.
__attribute__((constructor)) static void symmemi_front_init(void) {
  pthread_atfork(NULL, NULL, symmemi_on_fork_child);
}

static const char symmemi_fork_text[] =
    ": libsymmem cannot run in a process made by fork() without exec after the "
    "library was loaded (its threads and locks did not survive the fork, and the "
    "memory it manages is the parent's); nothing was done. Start worker processes "
    "with exec (posix_spawn; Python multiprocessing's 'spawn' or 'forkserver' start "
    "method) and load the library there";

void symmemi_refuse_in_child(const char *call) {
  char msg[sizeof symmemi_fork_text + 64];
  size_t n = strlen(call);
  if (n > 63) n = 63;
  memcpy(msg, call, n);
  memcpy(msg + n, symmemi_fork_text, sizeof symmemi_fork_text);
  symmemi_set_error(SYMMEM_ERROR_UNAVAILABLE, msg, n + sizeof symmemi_fork_text - 1);
}

#define OUT_NULL_THEN(out, code) ((out) != NULL ? (void)(*(out) = NULL) : (void)0, (code))
#define UNAVAILABLE SYMMEM_ERROR_UNAVAILABLE

// Version, errors, backend. (The last-error functions are plain C in
// errors.c and work in a forked child: that is where it reads why.)
SYMMEM_FRONT(int, version, SYMMEM_VERSION, (void), ())
SYMMEM_FRONT(const char *, strerror, "unavailable (libsymmem in a forked child)", (symmem_result code), (code))
SYMMEM_FRONT(const char *, backend_name, "none", (void), ())
SYMMEM_FRONT(const char *, backend_notes, "libsymmem cannot run in a forked child", (void), ())
SYMMEM_FRONT(int, device_count, 0, (void), ())

// The caching allocator. alloc and free have fronts written by hand, with
// the thread caches' fast path (tcache.c).
SYMMEM_FRONT_VOID(record_stream, (void *ptr, symmem_stream_t stream), (ptr, stream))
SYMMEM_FRONT_VOID(init, (int device_count), (device_count))
SYMMEM_FRONT_VOID(reset, (void), ())
SYMMEM_FRONT_VOID(memory_fraction, (double fraction, int device), (fraction, device))
SYMMEM_FRONT(symmem_result, empty_cache, UNAVAILABLE, (int device), (device))
SYMMEM_FRONT(symmem_result, thread_caches_drain, UNAVAILABLE, (int device), (device))
SYMMEM_FRONT(symmem_result, set_memory_limit, UNAVAILABLE, (int device, size_t bytes), (device, bytes))
SYMMEM_FRONT(symmem_result, get_memory_limit, UNAVAILABLE, (int device, size_t *bytes), (device, bytes))
SYMMEM_FRONT(size_t, stats, 0, (int device, symmem_stat *out, size_t capacity), (device, out, capacity))
SYMMEM_FRONT(symmem_result, reset_peak_stats, UNAVAILABLE, (int device), (device))
SYMMEM_FRONT(symmem_result, pointer_get_info, UNAVAILABLE, (const void *ptr, symmem_pointer_info *info), (ptr, info))
SYMMEM_FRONT(symmem_result, copy, UNAVAILABLE,
             (void *dst, const void *src, size_t n, int device, symmem_stream_t stream), (dst, src, n, device, stream))
SYMMEM_FRONT(symmem_result, memset, UNAVAILABLE,
             (void *dst, int value, size_t n, int device, symmem_stream_t stream), (dst, value, n, device, stream))
SYMMEM_FRONT(symmem_result, validate, UNAVAILABLE, (int device), (device))

// Symmetric memory.
SYMMEM_FRONT(symmem_result, group_create, OUT_NULL_THEN(out, UNAVAILABLE),
             (const char *name, int rank, int world_size, int device, int64_t timeout_ms, symmem_group **out),
             (name, rank, world_size, device, timeout_ms, out))
SYMMEM_FRONT(symmem_result, group_create_with_allgather, OUT_NULL_THEN(out, UNAVAILABLE),
             (const char *name, int rank, int world_size, int device, int64_t timeout_ms,
              symmem_allgather_fn allgather, void *user, symmem_group **out),
             (name, rank, world_size, device, timeout_ms, allgather, user, out))
SYMMEM_FRONT(symmem_result, group_destroy, UNAVAILABLE, (symmem_group *group), (group))
SYMMEM_FRONT(symmem_result, group_abort, UNAVAILABLE, (symmem_group *group), (group))
SYMMEM_FRONT(symmem_result, set_interrupt_fd, UNAVAILABLE, (int fd), (fd))
SYMMEM_FRONT(int, group_rank, -1, (const symmem_group *group), (group))
SYMMEM_FRONT(int, group_world_size, -1, (const symmem_group *group), (group))
SYMMEM_FRONT(int, group_device, -1, (const symmem_group *group), (group))
SYMMEM_FRONT(int, group_local_rank, -1, (const symmem_group *group), (group))
SYMMEM_FRONT(int, group_local_size, -1, (const symmem_group *group), (group))
SYMMEM_FRONT(int, group_is_local, -1, (const symmem_group *group, int rank), (group, rank))
SYMMEM_FRONT(size_t, group_machine, 0, (const symmem_group *group, int rank, char *buf, size_t len), (group, rank, buf, len))
SYMMEM_FRONT(int, handle_mapped_peers, -1, (const symmem_handle *handle), (handle))
SYMMEM_FRONT(symmem_result, group_set_signal_pad_size, UNAVAILABLE, (symmem_group *group, size_t bytes), (group, bytes))
SYMMEM_FRONT(symmem_result, rendezvous, OUT_NULL_THEN(out, UNAVAILABLE),
             (void *ptr, symmem_group *group, symmem_handle **out), (ptr, group, out))
SYMMEM_FRONT(symmem_result, handle_release, UNAVAILABLE, (symmem_handle *handle), (handle))
SYMMEM_FRONT(int, handle_rank, -1, (const symmem_handle *handle), (handle))
SYMMEM_FRONT(int, handle_world_size, -1, (const symmem_handle *handle), (handle))
SYMMEM_FRONT(size_t, handle_buffer_size, 0, (const symmem_handle *handle), (handle))
SYMMEM_FRONT(size_t, handle_offset, 0, (const symmem_handle *handle), (handle))
SYMMEM_FRONT(size_t, handle_signal_pad_size, 0, (const symmem_handle *handle), (handle))
SYMMEM_FRONT(void *, handle_buffer_ptr, NULL, (const symmem_handle *handle, int rank), (handle, rank))
SYMMEM_FRONT(void *, handle_signal_pad_ptr, NULL, (const symmem_handle *handle, int rank), (handle, rank))
SYMMEM_FRONT(void *const *, handle_buffer_ptrs, NULL, (const symmem_handle *handle), (handle))
SYMMEM_FRONT(void *const *, handle_signal_pad_ptrs, NULL, (const symmem_handle *handle), (handle))
SYMMEM_FRONT(void *const *, handle_buffer_ptrs_dev, NULL, (const symmem_handle *handle), (handle))
SYMMEM_FRONT(symmem_result, handle_describe, UNAVAILABLE, (const symmem_handle *handle, symmem_handle_desc *desc), (handle, desc))
SYMMEM_FRONT(void *const *, handle_signal_pad_ptrs_dev, NULL, (const symmem_handle *handle), (handle))
// Groups over an NCCL communicator.
SYMMEM_FRONT(symmem_result, group_create_nccl, OUT_NULL_THEN(out, UNAVAILABLE),
             (void *nccl_comm, const char *name, int64_t timeout_ms, unsigned flags, symmem_group **out),
             (nccl_comm, name, timeout_ms, flags, out))
SYMMEM_FRONT(int, nccl_version, 0, (void), ())
SYMMEM_FRONT(symmem_result, handle_nccl_window, UNAVAILABLE,
             (const symmem_handle *handle, void **window, size_t *offset), (handle, window, offset))
SYMMEM_FRONT(symmem_result, group_nccl_window_counts, UNAVAILABLE,
             (const symmem_group *group, int64_t *registered, int64_t *deregistered, int64_t *live),
             (group, registered, deregistered, live))
SYMMEM_FRONT(symmem_result, put_signal, UNAVAILABLE,
             (symmem_handle *handle, int dst_rank, int channel, symmem_stream_t stream), (handle, dst_rank, channel, stream))
SYMMEM_FRONT(symmem_result, wait_signal, UNAVAILABLE,
             (symmem_handle *handle, int src_rank, int channel, int64_t timeout_ms, symmem_stream_t stream),
             (handle, src_rank, channel, timeout_ms, stream))
SYMMEM_FRONT(symmem_result, barrier, UNAVAILABLE,
             (symmem_handle *handle, int channel, int64_t timeout_ms, symmem_stream_t stream),
             (handle, channel, timeout_ms, stream))

// Collectives.
SYMMEM_FRONT(symmem_result, all_reduce, UNAVAILABLE,
             (symmem_handle *handle, symmem_dtype dtype, symmem_op op, size_t count, void *out, symmem_stream_t stream),
             (handle, dtype, op, count, out, stream))
SYMMEM_FRONT(symmem_result, all_gather, UNAVAILABLE,
             (symmem_handle *handle, symmem_dtype dtype, size_t count, void *out, symmem_stream_t stream),
             (handle, dtype, count, out, stream))
SYMMEM_FRONT(symmem_result, reduce_scatter, UNAVAILABLE,
             (symmem_handle *handle, symmem_dtype dtype, symmem_op op, size_t count, void *out, symmem_stream_t stream),
             (handle, dtype, op, count, out, stream))
SYMMEM_FRONT(symmem_result, collective, UNAVAILABLE,
             (symmem_handle *handle, symmem_coll coll, symmem_dtype dtype, symmem_op op, size_t count, void *out,
              symmem_algo algo, int channel, symmem_stream_t stream),
             (handle, coll, dtype, op, count, out, algo, channel, stream))
SYMMEM_FRONT(symmem_result, collective_from, UNAVAILABLE,
             (symmem_handle *handle, symmem_coll coll, symmem_dtype dtype, symmem_op op, size_t count, const void *in,
              void *out, symmem_algo algo, int channel, symmem_stream_t stream),
             (handle, coll, dtype, op, count, (void *)in, out, algo, channel, stream))
SYMMEM_FRONT(size_t, low_latency_max_bytes, 0, (symmem_handle *handle), (handle))
SYMMEM_FRONT(symmem_result, all_to_all, UNAVAILABLE,
             (symmem_handle *handle, symmem_dtype dtype, size_t count, void *out, symmem_stream_t stream),
             (handle, dtype, count, out, stream))
SYMMEM_FRONT(symmem_result, all_to_all_v, UNAVAILABLE,
             (symmem_handle *handle, size_t row_bytes, const int64_t *in_splits, void *out, size_t out_rows,
              int64_t *out_splits_offsets, symmem_stream_t stream),
             (handle, row_bytes, (void *)in_splits, out, out_rows, out_splits_offsets, stream))
SYMMEM_FRONT(symmem_result, all_to_all_v_2d, UNAVAILABLE,
             (symmem_handle *handle, size_t row_bytes, int experts, const int64_t *in_splits, void *out,
              size_t out_rows, int64_t *out_splits_offsets, int64_t major_align, symmem_stream_t stream),
             (handle, row_bytes, experts, (void *)in_splits, out, out_rows, out_splits_offsets, major_align, stream))
SYMMEM_FRONT(symmem_result, all_to_all_v_2d_offset, UNAVAILABLE,
             (symmem_handle *handle, size_t row_bytes, int experts, const int64_t *in_splits_offsets, void *out,
              size_t out_rows, int64_t *out_splits_offsets, symmem_stream_t stream),
             (handle, row_bytes, experts, (void *)in_splits_offsets, out, out_rows, out_splits_offsets, stream))
SYMMEM_FRONT(symmem_result, all_reduce_rmsnorm, UNAVAILABLE,
             (symmem_handle *handle, symmem_dtype dtype, size_t tokens, size_t hidden, void *residual,
              const void *weight, float eps, void *out, symmem_algo algo, symmem_stream_t stream),
             (handle, dtype, tokens, hidden, residual, (void *)weight, eps, out, algo, stream))
SYMMEM_FRONT(symmem_result, all_reduce_rmsnorm_from, UNAVAILABLE,
             (symmem_handle *handle, symmem_dtype dtype, size_t tokens, size_t hidden, const void *in, void *residual,
              const void *weight, float eps, void *out, symmem_algo algo, symmem_stream_t stream),
             (handle, dtype, tokens, hidden, (void *)in, residual, (void *)weight, eps, out, algo, stream))
SYMMEM_FRONT(symmem_result, handle_device_error, UNAVAILABLE, (const symmem_handle *handle, uint32_t *flag),
             (handle, flag))
SYMMEM_FRONT(symmem_result, collectives_load, UNAVAILABLE, (int device, symmem_kernel_info *info), (device, info))
