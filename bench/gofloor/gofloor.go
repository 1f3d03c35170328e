// Command gofloor is the Go floor of PyTorch's pluggable-allocator path
// (bench/torch_alloc_bench.py, mode go_cache): a size-keyed free list under
// one mutex, like the C floor (c_cache), but reached through two C-to-Go
// calls per tensor like libsymmem. Its memory comes from cuMemAlloc (the
// driver, loaded with dlopen; PyTorch has made the context current) and is
// never returned. Build: go build -buildmode=c-shared -o build/libgofloor.so
// ./bench/gofloor (make gpu-artifacts does).
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
typedef int (*mem_alloc_fn)(uint64_t *dptr, size_t bytes);
static mem_alloc_fn floor_mem_alloc;
static int floor_load(void) {
	if (floor_mem_alloc) return 0;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!h) return -1;
	floor_mem_alloc = (mem_alloc_fn)dlsym(h, "cuMemAlloc_v2");
	return floor_mem_alloc ? 0 : -1;
}
static uint64_t floor_cuda_alloc(size_t bytes) {
	uint64_t p = 0;
	if (floor_load() != 0 || floor_mem_alloc(&p, bytes) != 0) return 0;
	return p;
}
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/libsymmem/libsymmem/core/unmanaged"
)

var (
	mu    sync.Mutex
	cache = map[uintptr][]uintptr{}
)

//export floor_alloc
func floor_alloc(size C.size_t, device C.int, stream unsafe.Pointer) unsafe.Pointer {
	mu.Lock()
	if l := cache[uintptr(size)]; len(l) > 0 {
		p := l[len(l)-1]
		cache[uintptr(size)] = l[:len(l)-1]
		mu.Unlock()
		return unmanaged.Pointer(p)
	}
	mu.Unlock()
	return unmanaged.Pointer(uintptr(C.floor_cuda_alloc(size)))
}

//export floor_free
func floor_free(ptr unsafe.Pointer, size C.size_t, device C.int, stream unsafe.Pointer) {
	mu.Lock()
	cache[uintptr(size)] = append(cache[uintptr(size)], uintptr(ptr))
	mu.Unlock()
}

func main() {}
