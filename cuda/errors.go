package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
)

// CUresult values that decide a core.Code (driver.h; CUDA Driver API).
const (
	cudaSuccess            = C.SM_CUDA_SUCCESS
	cudaErrorOutOfMemory   = C.SM_CUDA_ERROR_OUT_OF_MEMORY
	cudaErrorNoDevice      = C.SM_CUDA_ERROR_NO_DEVICE
	cudaErrorInvalidDevice = C.SM_CUDA_ERROR_INVALID_DEVICE
	cudaErrorNotPermitted  = C.SM_CUDA_ERROR_NOT_PERMITTED
	cudaErrorNotSupported  = C.SM_CUDA_ERROR_NOT_SUPPORTED
	// CUDA_ERROR_OPERATING_SYSTEM: what the driver answers when a system
	// call fails, for instance when no file descriptor is left.
	cudaErrorOperatingSystem = 304
)

// resultCode maps a CUresult to the core.Code that callers of the C API see.
func resultCode(res int) core.Code {
	switch res {
	case cudaSuccess:
		return core.Success
	case cudaErrorOutOfMemory:
		return core.ErrOutOfMemory
	case cudaErrorInvalidDevice:
		return core.ErrInvalidDevice
	case cudaErrorNotPermitted:
		return core.ErrPermission
	case cudaErrorNotSupported, cudaErrorNoDevice:
		return core.ErrUnavailable
	default:
		return core.ErrBackend
	}
}

// errorName is the driver's name for res (CUDA_ERROR_OUT_OF_MEMORY), or
// CUDA_ERROR_<n> when the driver is not loaded or does not know res.
func errorName(res int) string {
	if s := C.smcu_error_name(C.int(res)); s != nil {
		return C.GoString(s)
	}
	return fmt.Sprintf("CUDA_ERROR_%d", res)
}

// errorString is the driver's description of res, or "unknown error".
func errorString(res int) string {
	if s := C.smcu_error_string(C.int(res)); s != nil {
		return C.GoString(s)
	}
	return "unknown error"
}

// driverError is the *core.Error for driver function call failing with res
// on device dev (dev < 0: a call that concerns no device).
func driverError(call string, dev int, res int) *core.Error {
	why := errorString(res)
	if res == cudaErrorOperatingSystem {
		if s := core.DescriptorShortage(); s != "" {
			why += "; " + s
		}
	}
	if dev < 0 {
		return core.Errorf(resultCode(res), "cuda: %s failed: %s (%s)", call, errorName(res), why)
	}
	return core.Errorf(resultCode(res), "cuda: %s failed on device %d: %s (%s)",
		call, dev, errorName(res), why)
}

// check turns a trampoline's status into nil or the error for device dev.
func check(st C.smcu_status, dev int) error {
	if st.res == cudaSuccess {
		return nil
	}
	return driverError(C.GoString(st.call), dev, int(st.res))
}
