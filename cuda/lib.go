package cuda

/*
#cgo CFLAGS: -std=gnu11 -Wall -Wextra
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
)

// EnvLibrary names the environment variable that overrides the path of the
// CUDA driver library.
const EnvLibrary = "SYMMEM_LIBCUDA"

// DefaultLibrary is the driver library loaded when EnvLibrary is unset: the
// soname the NVIDIA driver installs (libcuda.so without ".1" is a toolkit
// development link and may be missing on machines with only the driver).
const DefaultLibrary = "libcuda.so.1"

// LibraryPath is the driver library Open loads: $SYMMEM_LIBCUDA, else
// DefaultLibrary (found through the dynamic linker's search path).
func LibraryPath() string {
	return core.Current().Text(EnvLibrary, DefaultLibrary)
}

// The driver is loaded at most once per process; libMu serialises loading
// (dlopen, dlsym into the C table, cuInit) and guards loadedPath. Failures
// are not remembered: a later call tries again, so a test or a user can fix
// SYMMEM_LIBCUDA and retry. The library is never unloaded (unloading libcuda
// while any context or allocation lives is unsafe, and nothing is gained).
var (
	libMu       sync.Mutex
	loadedPath  string      // the path the C table came from; "" before the first load
	driverReady atomic.Bool // a load and cuInit have succeeded
)

// loadDriver makes sure the driver at path is loaded, resolved and
// initialised (cuInit(0)). Loading a second time with a path that names the
// library already loaded is cheap; a path naming another library fails.
func loadDriver(path string) error {
	libMu.Lock()
	defer libMu.Unlock()

	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	switch C.smcu_load(cpath, &msg[0], C.size_t(len(msg))) {
	case C.SMCU_LOAD_OK:
	case C.SMCU_LOAD_DLOPEN:
		return core.Errorf(core.ErrUnavailable,
			"cuda: cannot load the CUDA driver library %q: %s (is the NVIDIA driver installed? %s overrides the path)",
			path, C.GoString(&msg[0]), EnvLibrary)
	case C.SMCU_LOAD_SYMBOL:
		return core.Errorf(core.ErrUnavailable,
			"cuda: the CUDA driver library %q has no function %s: it is too old, or not NVIDIA's libcuda (libsymmem is tested with CUDA 12 drivers)",
			path, C.GoString(&msg[0]))
	default:
		return core.Errorf(core.ErrUnavailable, "cuda: cannot use the CUDA driver library %q: %s (%q)",
			path, C.GoString(&msg[0]), loadedPath)
	}
	if loadedPath == "" {
		loadedPath = path
	}

	// cuInit is cheap once it has succeeded, and retried when it has not.
	if st := C.smcu_init(); st.res != C.SM_CUDA_SUCCESS {
		r := int(st.res)
		return core.Errorf(core.ErrUnavailable, "cuda: cuInit(0) failed with the driver %q: %s (%s)",
			path, errorName(r), errorString(r))
	}
	driverReady.Store(true)
	return nil
}

// ensureDriver loads the driver for the package-level query functions: the
// library already loaded if any, else LibraryPath().
func ensureDriver() error {
	if driverReady.Load() {
		return nil
	}
	libMu.Lock()
	path := loadedPath
	libMu.Unlock()
	if path == "" {
		path = LibraryPath()
	}
	return loadDriver(path)
}
