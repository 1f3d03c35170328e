// Package nccltest makes communicators of the NCCL stand-in
// (cuda/testdata/fakenccl.c) for tests. libsymmem never makes a
// communicator (it uses its caller's), so nothing outside tests needs
// ncclCommInitRank; it lives here rather than in package cuda's table.
package nccltest

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } nt_unique_id;
typedef int (*nt_init_fn)(void **, int, nt_unique_id, int);
typedef int (*nt_destroy_fn)(void *);
typedef const char *(*nt_last_fn)(void *);

// The library at path (the same handle as the loader's when it is loaded).
static void *nt_open(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }

static int nt_init(void *lib, const char *name, int world, int rank, uintptr_t *out) {
  nt_init_fn init = (nt_init_fn)dlsym(lib, "ncclCommInitRank");
  if (init == NULL)
    return -1;
  nt_unique_id id;
  memset(&id, 0, sizeof id);
  snprintf(id.internal, sizeof id.internal, "fakenccl-%s", name);
  void *comm = NULL;
  int r = init(&comm, world, id, rank);
  *out = (uintptr_t)comm;
  return r;
}

static int nt_destroy(void *lib, uintptr_t comm) {
  nt_destroy_fn d = (nt_destroy_fn)dlsym(lib, "ncclCommDestroy");
  return d == NULL ? -1 : d((void *)comm);
}

static const char *nt_last(void *lib) {
  nt_last_fn f = (nt_last_fn)dlsym(lib, "ncclGetLastError");
  return f == NULL ? "" : f(NULL);
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// InitRank is ncclCommInitRank(rank of world) of the stand-in at path, on
// the communicator named name (every rank passes the same name).
func InitRank(path, name string, world, rank int) (uintptr, error) {
	lib, err := open(path)
	if err != nil {
		return 0, err
	}
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	var comm C.uintptr_t
	if r := C.nt_init(lib, cn, C.int(world), C.int(rank), &comm); r != 0 {
		return 0, fmt.Errorf("ncclCommInitRank(%q, rank %d of %d) failed with %d: %s", name, rank, world, int(r), C.GoString(C.nt_last(lib)))
	}
	return uintptr(comm), nil
}

// Destroy is ncclCommDestroy of a communicator InitRank made.
func Destroy(path string, comm uintptr) error {
	lib, err := open(path)
	if err != nil {
		return err
	}
	if r := C.nt_destroy(lib, C.uintptr_t(comm)); r != 0 {
		return fmt.Errorf("ncclCommDestroy failed with %d", int(r))
	}
	return nil
}

func open(path string) (unsafe.Pointer, error) {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	lib := C.nt_open(cp)
	if lib == nil {
		return nil, fmt.Errorf("dlopen %q: %s", path, C.GoString(C.dlerror()))
	}
	return lib, nil
}
