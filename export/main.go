// Command export is the C ABI of libsymmem: thin //export functions that
// marshal between C and the Go packages, nothing more. Build it with
// go build -buildmode=c-shared (see the Makefile); include/symmem.h is the
// contract these functions implement.
package main

/*
#include "internal.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	_ "github.com/libsymmem/libsymmem/core/host"
	_ "github.com/libsymmem/libsymmem/cuda"
)

func main() {}

var strict = core.Current().Bool("SYMMEM_STRICT", false)

// runtimeOrError returns the process runtime, or the reason there is none.
func runtimeOrError() (*core.Runtime, error) { return core.Default() }

// allocatorFor returns the allocator of device.
func allocatorFor(device C.int) (*core.Allocator, error) {
	rt, err := core.Default()
	if err != nil {
		return nil, err
	}
	return rt.Allocator(int(device))
}

// setLastError records err as the calling thread's last error, prefixed with
// the name of the C call, and returns its code for functions that return a
// symmem_result. nil is SYMMEM_SUCCESS and records nothing.
func setLastError(call string, err error) C.int {
	if err == nil {
		return 0
	}
	code := core.CodeOf(err)
	msg := call + ": " + err.Error()
	C.symmemi_set_error(C.int(code), cstr(msg), C.size_t(len(msg)))
	return C.int(code)
}

// cstr points C at the bytes of s (not NUL-terminated) for the duration of a
// call that copies them.
func cstr(s string) *C.char {
	if len(s) == 0 {
		return (*C.char)(unsafe.Pointer(&zero))
	}
	return (*C.char)(unsafe.Pointer(unsafe.StringData(s)))
}

var zero byte

// ptrAt turns an address of memory that Go does not manage into a pointer
// (without the uintptr-to-Pointer conversion that vet rejects).
func ptrAt(addr uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&addr))
}

// staticStrings holds C strings made once and never freed: names that C
// callers may keep for the life of the process.
var staticStrings sync.Map // string -> *C.char

func staticCString(s string) *C.char {
	if p, ok := staticStrings.Load(s); ok {
		return p.(*C.char)
	}
	staticMu.Lock()
	defer staticMu.Unlock()
	if p, ok := staticStrings.Load(s); ok { // another thread made it meanwhile
		return p.(*C.char)
	}
	c := keptCString(s)
	staticStrings.Store(s, c)
	return c
}

// staticMu serialises the making of static strings (each is made once).
var staticMu sync.Mutex

// keptCString is a C copy of s that lives as long as the process, held from
// C (Note [Strings kept for the life of the process] in keep.c).
func keptCString(s string) *C.char {
	return C.symmemi_keep_string(cstr(s), C.size_t(len(s)))
}

//export symmem_version
func symmem_version() C.int { return C.int(core.Version) }

//export symmem_strerror
func symmem_strerror(code C.int) *C.char { return staticCString(core.Code(code).String()) }

//export symmem_backend_name
func symmem_backend_name() *C.char {
	rt, _ := core.Default()
	if rt.Backend == nil {
		return staticCString("none")
	}
	return staticCString(rt.Backend.Name())
}

//export symmem_backend_notes
func symmem_backend_notes() *C.char {
	rt, _ := core.Default()
	return staticCString(rt.NotesText())
}

//export symmem_device_count
func symmem_device_count() C.int {
	rt, err := core.Default()
	if err != nil {
		setLastError("symmem_device_count", err)
		return 0
	}
	return C.int(rt.Backend.DeviceCount())
}

func describeDevice(call string, device C.int) string {
	return fmt.Sprintf("%s(device=%d)", call, int(device))
}
