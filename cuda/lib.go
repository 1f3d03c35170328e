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

// DefaultLibrary is the driver's soname: the name the NVIDIA driver installs
// (libcuda.so without ".1" is a toolkit development link and may be missing
// on machines with only the driver; the toolkit's stubs/libcuda.so is a
// stub that must never be loaded, so no toolkit folder is searched).
const DefaultLibrary = "libcuda.so.1"

// driverSpec finds the driver (Note [Libraries loaded at run time]): the
// copy already loaded, else $SYMMEM_LIBCUDA, else libcuda.so.1.
var driverSpec = LibrarySpec{What: "the CUDA driver library", Env: EnvLibrary, Sonames: []string{DefaultLibrary}}

// LibraryPath is the driver library Open loads when none is loaded yet:
// $SYMMEM_LIBCUDA, else DefaultLibrary (found through the dynamic linker's
// search path).
func LibraryPath() string {
	return core.Current().Text(EnvLibrary, DefaultLibrary)
}

// driverSymbols is the driver's table (driver.h's SM_CU_FUNCTIONS, in
// order), with the older names some versioned symbols fall back to.
var driverSymbols = func() []Symbol {
	alt := map[string][]string{
		"cuDeviceGetUuid_v2":      {"cuDeviceGetUuid"},      // drivers before 11.4
		"cuStreamWriteValue32_v2": {"cuStreamWriteValue32"}, // before 11.7
		"cuStreamWaitValue32_v2":  {"cuStreamWaitValue32"},
	}
	syms := make([]Symbol, int(C.smcu_symbol_count))
	names := unsafe.Slice((**C.char)(unsafe.Pointer(&C.smcu_symbol_names)), len(syms))
	optional := len(syms) - int(C.smcu_optional_count)
	for i := range syms {
		n := C.GoString(names[i])
		syms[i] = Symbol{Name: n, Alt: alt[n], Optional: i >= optional}
	}
	return syms
}()

// The driver is loaded at most once per process; libMu serialises loading
// (open, resolve into the C table, cuInit) and guards driver. Failures are
// not remembered: a later call tries again, so a test or a user can fix
// SYMMEM_LIBCUDA and retry. The library is never unloaded (unloading libcuda
// while any context or allocation lives is unsafe, and nothing is gained).
var (
	libMu       sync.Mutex
	driver      *Library    // the library the C table came from; nil before the first load
	driverReady atomic.Bool // a load and cuInit have succeeded
)

// loadDriver makes sure the driver is loaded, resolved and initialised
// (cuInit(0)), and returns the path it came from. Once a driver is loaded,
// finding another one (SYMMEM_LIBCUDA changed) fails.
func loadDriver() (string, error) {
	libMu.Lock()
	defer libMu.Unlock()

	lib, err := OpenLibrary(driverSpec)
	if err != nil {
		err = core.Errorf(core.ErrUnavailable, "cuda: %v (is the NVIDIA driver installed? %s overrides the path)", err, EnvLibrary)
		if env(EnvLibrary) != "" { // an order that could not be followed (Note [Explicit settings are orders])
			err = core.Explicit(EnvLibrary, err)
		}
		return "", err
	}
	switch {
	case driver == nil:
		tab := C.malloc(C.size_t(len(driverSymbols)) * C.size_t(unsafe.Sizeof(uintptr(0))))
		defer C.free(tab)
		if _, err := lib.Resolve(driverSymbols, 0, "", tab); err != nil {
			return "", err
		}
		C.smcu_install(tab)
		driver = lib
	case driver.handle != lib.handle:
		return "", core.Errorf(core.ErrUnavailable, "cuda: cannot use the CUDA driver library %s: the driver %s is already loaded in this process",
			core.Quote(lib.Path), core.Quote(driver.Path))
	}

	// cuInit is cheap once it has succeeded, and retried when it has not.
	if st := C.smcu_init(); st.res != C.SM_CUDA_SUCCESS {
		r := int(st.res)
		return "", core.Errorf(core.ErrUnavailable, "cuda: cuInit(0) failed with the driver %s: %s (%s)",
			core.Quote(lib.Path), errorName(r), errorString(r))
	}
	driverReady.Store(true)
	return lib.Path, nil
}

// ensureDriver loads the driver for the package-level query functions.
func ensureDriver() error {
	if driverReady.Load() {
		return nil
	}
	_, err := loadDriver()
	return err
}
