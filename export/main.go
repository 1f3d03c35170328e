// Command export is the C ABI of libsymmem: thin //export functions that
// marshal between C and the Go packages, nothing more. Build it with
// go build -buildmode=c-shared (see the Makefile); include/symmem.h is the
// contract these functions implement.
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#include "internal.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	_ "github.com/libsymmem/libsymmem/core/host"
	_ "github.com/libsymmem/libsymmem/cuda"
)

func main() {}

var strict = core.Current().Bool("SYMMEM_STRICT", false)

// At load, one line on stderr for each SYMMEM_* variable that is no
// setting (a misspelt SYMMEM_TIMEOUT would otherwise do nothing), unless
// SYMMEM_QUIET is set (Note [Settings]).
func init() { core.Current().WarnUnknown(os.Stderr) }

// runtimeOrError returns the process runtime, or the reason there is none.
func runtimeOrError() (*alloc.Runtime, error) { return alloc.Default() }

// allocatorFor returns the allocator of device.
func allocatorFor(device C.int) (*alloc.Allocator, error) {
	rt, err := alloc.Default()
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

// Note [The guard]
//
// A Go panic that escaped an exported function would kill the host process
// (a PyTorch job). Every symmemgo_ function therefore starts with a deferred
// recoverCall (or recoverVoid): a panic on the calling thread becomes
// SYMMEM_ERROR_INTERNAL, with the panic's text and where it happened as the
// last error, and the function returns its failure value. With
// SYMMEM_STRICT=1 the process aborts with that message instead (a bug found
// loudly in testing). What no guard can catch: a panic on another goroutine,
// and faults the Go runtime treats as fatal (a wild pointer dereferenced
// outside runtime/debug.SetPanicOnFault).

// recoverCall is the guard of a function with a result: deferred first
// thing, it sets *result to fail when the function panics. (recover works
// here because the deferred call is to recoverCall itself.)
func recoverCall[T any](call string, result *T, fail T) {
	if r := recover(); r != nil {
		*result = fail
		reportPanic(call, r)
	}
}

// recoverVoid is the guard of a function without a result.
func recoverVoid(call string) {
	if r := recover(); r != nil {
		reportPanic(call, r)
	}
}

// reportPanic records a recovered panic as the calling thread's last error
// (SYMMEM_ERROR_INTERNAL), naming the function that panicked, and aborts in
// strict mode.
func reportPanic(call string, r any) {
	where := ""
	pcs := make([]uintptr, 16)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		// The first frame outside the runtime is where the panic happened.
		if !strings.HasPrefix(f.Function, "runtime.") && f.Function != "" {
			where = fmt.Sprintf(" in %s (%s:%d)", f.Function, filepath.Base(f.File), f.Line)
			break
		}
		if !more {
			break
		}
	}
	msg := fmt.Sprintf("%s: internal error, please report it: Go panic%s: %v", call, where, r)
	C.symmemi_set_error(C.int(core.ErrInternal), cstr(msg), C.size_t(len(msg)))
	if strict {
		C.symmemi_abort(cstr(msg), C.size_t(len(msg)))
	}
}

// internalErrorText is what functions returning a static string return
// when they panic.
func internalErrorText() *C.char { return staticCString("internal error (see the last error)") }

// cstr points C at the bytes of s (not NUL-terminated) for the duration of a
// call that copies them.
func cstr(s string) *C.char {
	if len(s) == 0 {
		return (*C.char)(unsafe.Pointer(&zero))
	}
	return (*C.char)(unsafe.Pointer(unsafe.StringData(s)))
}

var zero byte

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

//export symmemgo_version
func symmemgo_version() (result C.int) {
	defer recoverCall("symmem_version", &result, C.int(core.Version))
	return C.int(core.Version)
}

// codeStrings are symmem_strerror's answers: one C string per known code,
// made once, and one for every unknown code (no string is made per call, so
// a caller looping over codes cannot grow the process).
var codeStrings, unknownCodeString = func() ([]*C.char, *C.char) {
	s := make([]*C.char, core.NumCodes)
	for c := range s {
		s[c] = keptCString(core.Code(c).String())
	}
	return s, keptCString("unknown result code")
}()

//export symmemgo_strerror
func symmemgo_strerror(code C.int) (result *C.char) {
	defer recoverCall("symmem_strerror", &result, internalErrorText())
	if code >= 0 && int(code) < len(codeStrings) {
		return codeStrings[code]
	}
	return unknownCodeString
}

//export symmemgo_backend_name
func symmemgo_backend_name() (result *C.char) {
	defer recoverCall("symmem_backend_name", &result, internalErrorText())
	rt, _ := alloc.Default()
	if rt.Backend == nil {
		return staticCString("none")
	}
	return staticCString(rt.Backend.Name())
}

//export symmemgo_backend_notes
func symmemgo_backend_notes() (result *C.char) {
	defer recoverCall("symmem_backend_notes", &result, internalErrorText())
	rt, _ := alloc.Default()
	return staticCString(rt.NotesText())
}

//export symmemgo_device_count
func symmemgo_device_count() (result C.int) {
	defer recoverCall("symmem_device_count", &result, 0)
	rt, err := alloc.Default()
	if err != nil {
		setLastError("symmem_device_count", err)
		return 0
	}
	return C.int(rt.Backend.DeviceCount())
}

func describeDevice(call string, device C.int) string {
	return fmt.Sprintf("%s(device=%d)", call, int(device))
}
