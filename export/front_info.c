// The C fronts of the diagnostic and snapshot functions (Note [The C front],
// front.h): snapshot.go and info.go hold their Go halves.
#include "internal.h"
#include "front.h"

SYMMEM_FRONT(size_t, info_json, 0, (char *buf, size_t len), (buf, len))
SYMMEM_FRONT(size_t, memory_snapshot_json, 0, (char *buf, size_t len), (buf, len))
SYMMEM_FRONT(symmem_result, record_history, SYMMEM_ERROR_UNAVAILABLE, (size_t max_entries), (max_entries))
SYMMEM_FRONT(symmem_result, set_context_hook, SYMMEM_ERROR_UNAVAILABLE, (symmem_context_fn fn, void *user), (fn, user))
