/* Note [Thread caches in C]
 *
 * The fast path of symmem_alloc and symmem_free (Note [Thread caches] in
 * core/alloc/threadcache.go says what the core lets it do). Each thread has, per
 * device (below SYMMEMI_TC_DEVICES), at most one bin: a symmemi_tcache,
 * allocated here, never freed (reused once the core has retired it), so the
 * core, which reads and writes it directly through cgo (export/tcache.go),
 * never reads freed memory.
 *
 * lock is a spinlock: the owner takes it (uncontended) in the fronts, the
 * core under the device's mutex when it syncs, drains or fills the bin.
 * Everything else in the struct is guarded by it, except state's
 * FREE -> LIVE step, made under the global list's mutex.
 *
 * state: FREE (in the list, reusable), LIVE (a thread's), DEAD (its thread
 * exited while the core tracked it: the core's next call on the device
 * adopts it, gives its blocks back and retires it to FREE). registered is
 * set by the core while it tracks the bin (it then holds blocks or pending
 * counts); an untracked bin is empty, so a thread that exits frees it at
 * once. The thread-exit destructor never calls Go. */
#ifndef SYMMEM_EXPORT_TCACHE_H
#define SYMMEM_EXPORT_TCACHE_H
#include <stdint.h>

#define SYMMEMI_TC_CAP 32     /* blocks per bin */
#define SYMMEMI_TC_DEVICES 16 /* devices with bins; others take the Go path */
#define SYMMEMI_TC_MAX_BLOCK (128u << 20) /* alloc.MaxCachedBlock */

enum { SYMMEMI_TC_FREE = 0, SYMMEMI_TC_LIVE = 1, SYMMEMI_TC_DEAD = 2 };

typedef struct symmemi_tc_entry {
  uintptr_t addr;
  uintptr_t size;   /* the block's size */
  uintptr_t stream; /* the block's stream */
  uintptr_t requested; /* out: the size asked at the hit */
  int32_t out;      /* handed out by a hit the core has not synced */
  int32_t pad;
} symmemi_tc_entry;

typedef struct symmemi_tcache {
  int32_t lock;
  int32_t len;
  int32_t state;
  int32_t registered;
  int32_t device;
  int32_t pad;
  /* Pending counts (core.CachePending): [count, bytes, requested][all,
   * small, large]. */
  int64_t hits[3][3];
  int64_t net[3][3];
  int64_t high[3][3];
  symmemi_tc_entry e[SYMMEMI_TC_CAP];
  struct symmemi_tcache *next; /* the global list, never unlinked */
} symmemi_tcache;

/* Set by Go at load (SYMMEM_THREAD_CACHE); 0 until then. */
extern int symmemi_tc_on;
#endif
