/* Note [The C front]
 *
 * Every public symmem_* function is a thin C function (a "front") that
 * checks one thing before it enters Go: whether this process is a child made
 * by fork() after the library was loaded. Such a child has none of the Go
 * runtime's threads, and a lock that another thread of the parent held at
 * fork time stays held forever, so entering Go there hangs. The front
 * refuses at once instead: it sets the calling thread's last error
 * (errors.c, plain C thread-local storage) to SYMMEM_ERROR_UNAVAILABLE with a
 * message naming fork and what to do, and returns the function's failure
 * value, without entering Go and without taking any lock.
 *
 * The flag is set by a pthread_atfork child handler registered by a
 * constructor when the library is loaded (front.c); the parent never sets
 * it. Everywhere else the front calls the Go implementation, symmemgo_NAME,
 * an //export function that export/symmem.map keeps out of the dynamic
 * symbol table (only symmem_* leaves the library).
 *
 * Writing a new export:
 *   1. In Go: //export symmemgo_NAME, its body starting with the guard
 *      (defer recoverCall(...) or defer recoverVoid(...), main.go), which
 *      turns a Go panic into SYMMEM_ERROR_INTERNAL.
 *   2. In C: one line SYMMEM_FRONT(return type, NAME, failure value,
 *      (parameters), (arguments)) (or SYMMEM_FRONT_VOID) in front.c or in a
 *      .c file of your own that includes this header; the prototype must be
 *      the one declared in include/symmem.h (front.c includes it, so the
 *      compiler checks that).
 *   3. export/front_test.go checks that every function of the header has a
 *      front (or is one of the pure-C functions of errors.c/torch_shim.cc)
 *      and that every Go export is a guarded symmemgo_ function.
 * symmem_alloc and symmem_free are fronts written by hand (tcache.c): they
 * try the calling thread's cache (Note [Thread caches in C], tcache.h)
 * before Go, after the same fork check (SYMMEMI_REFUSE_IN_CHILD). */
#ifndef SYMMEM_EXPORT_FRONT_H
#define SYMMEM_EXPORT_FRONT_H
#include "symmem.h"

/* Non-zero in a child made by fork() after the library was loaded. */
extern volatile int symmemi_forked;

/* Records "call refused in a forked child" as the last error. Cold. */
void symmemi_refuse_in_child(const char *call) __attribute__((cold));

#define SYMMEMI_IN_CHILD() __builtin_expect(symmemi_forked != 0, 0)

/* A front for a function that returns a value; fail is what it returns in
 * a forked child (an expression; it may clear out-parameters first). */
#define SYMMEM_FRONT(ret, name, fail, params, args)                            \
  ret symmemgo_##name params;                                                  \
  __attribute__((visibility("default"))) ret symmem_##name params {            \
    if (SYMMEMI_IN_CHILD()) {                                                  \
      symmemi_refuse_in_child("symmem_" #name);                                \
      return fail;                                                             \
    }                                                                          \
    return symmemgo_##name args;                                               \
  }

/* The first statement of a front written by hand (symmem_alloc and
 * symmem_free, tcache.c, which try the thread cache before Go): refuses in
 * a forked child, returning what follows the name. export/front_test.go
 * checks that every hand-written front starts with it and calls its Go
 * export. */
#define SYMMEMI_REFUSE_IN_CHILD(name, ...)                                     \
  do {                                                                         \
    if (SYMMEMI_IN_CHILD()) {                                                  \
      symmemi_refuse_in_child("symmem_" #name);                                \
      return __VA_ARGS__;                                                      \
    }                                                                          \
  } while (0)

/* A front for a function that returns nothing. */
#define SYMMEM_FRONT_VOID(name, params, args)                                  \
  void symmemgo_##name params;                                                 \
  __attribute__((visibility("default"))) void symmem_##name params {           \
    if (SYMMEMI_IN_CHILD()) {                                                  \
      symmemi_refuse_in_child("symmem_" #name);                                \
      return;                                                                  \
    }                                                                          \
    symmemgo_##name args;                                                      \
  }

#endif
