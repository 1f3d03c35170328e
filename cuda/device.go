package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"

	"github.com/libsymmem/libsymmem/core"
)

// Handle type bit sets for cuMemCreate (driver.h).
const (
	handlePOSIX  = C.SM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	handleFabric = C.SM_CU_MEM_HANDLE_TYPE_FABRIC
)

// States of device.fabric (Note [handle types]).
const (
	fabricUntried int32 = iota // supported by the device, not tried yet
	fabricOn                   // a FABRIC|POSIX_FD allocation succeeded: keep asking for it
	fabricOff                  // unsupported or refused: POSIX_FD only
)

// device is the backend's state for one device. The fields below mu are set
// once by init, under mu, before ready is stored; a reader that has seen
// ready == true may read them without the lock.
type device struct {
	ordinal int   // the index callers use
	cu      C.int // the CUdevice cuDeviceGet returned for ordinal

	mu    sync.Mutex
	ready atomic.Bool
	ctx   C.uintptr_t // the retained primary context
	gran  uintptr     // minimum granularity, for every handle type we may request

	// access lists the devices every mapping on this device grants access
	// to (accessList); accessOnce guards its computation.
	accessOnce sync.Once
	access     []C.int

	// kern is the device's collectives module, loaded at first use under
	// kernMu (kernels.go).
	kernMu sync.Mutex
	kern   *kernelModule

	// ownStream is the library's own non-blocking stream for MemsetWithin
	// and CopyWithin (0 until first used); guarded by mu.
	ownStream C.uintptr_t

	// copyStreams are the library's non-blocking streams on which the
	// copies of CopiesAsync run beside the caller's stream, made as calls
	// need more and kept for the process's life; sideMu guards them and
	// makes each call's fork and join one step.
	sideMu      sync.Mutex
	copyStreams []C.uintptr_t

	fabric    atomic.Int32 // fabricUntried, fabricOn or fabricOff
	fabricWhy atomic.Value // string: why fabric handles are off, for messages
	// domain caches FabricDomain's answer once fabric handles are settled
	// (a *fabricDomain): every group creation asks.
	domain atomic.Value
}

// attribute reads a device attribute (no context needed).
func (d *device) attribute(attr C.int) (int, error) {
	var v C.int
	if err := check(C.smcu_device_attribute(d.cu, attr, &v), d.ordinal); err != nil {
		return 0, err
	}
	return int(v), nil
}

// init checks that the device can do what the backend needs, retains its
// primary context and computes the granularity. It runs once, on the first
// use of the device; a failure is returned and init is tried again next time.
func (d *device) init() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ready.Load() {
		return nil
	}
	vmm, err := d.attribute(C.SM_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
	if err != nil {
		return err
	}
	if vmm == 0 {
		return core.Errorf(core.ErrUnavailable,
			"cuda: device %d (%s) does not support virtual memory management (cuMemCreate/cuMemMap), which libsymmem needs",
			d.ordinal, deviceNameOrUnknown(d.cu))
	}
	fd, err := d.attribute(C.SM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
	if err != nil {
		return err
	}
	if fd == 0 {
		return core.Errorf(core.ErrUnavailable,
			"cuda: device %d (%s) cannot export memory as POSIX file descriptors, which libsymmem needs",
			d.ordinal, deviceNameOrUnknown(d.cu))
	}
	// Drivers older than 12.3 do not know the attribute and fail the query:
	// that, like 0, means no fabric handles.
	if v, err := d.attribute(C.SM_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED); err != nil || v == 0 {
		d.fabric.Store(fabricOff)
		d.fabricWhy.Store("the device does not report fabric handle support")
	}

	var ctx C.uintptr_t
	if err := check(C.smcu_primary_retain(d.cu, &ctx), d.ordinal); err != nil {
		return err
	}
	gran, err := d.granularity(ctx)
	if err != nil {
		C.smcu_primary_release(d.cu)
		return err
	}
	d.ctx, d.gran = ctx, gran
	d.ready.Store(true)
	return nil
}

// granularity is the minimum granularity of a POSIX_FD allocation, or of a
// FABRIC|POSIX_FD one if that is larger and fabric may be tried, so that one
// granularity fits whichever Create ends up using.
func (d *device) granularity(ctx C.uintptr_t) (uintptr, error) {
	var g C.size_t
	if err := check(C.smcu_granularity(ctx, d.cu, handlePOSIX, &g), d.ordinal); err != nil {
		return 0, err
	}
	gran := uintptr(g)
	if d.fabric.Load() == fabricUntried {
		var gf C.size_t
		err := check(C.smcu_granularity(ctx, d.cu, handlePOSIX|handleFabric, &gf), d.ordinal)
		switch {
		case err != nil:
			d.fabric.Store(fabricOff)
			d.fabricWhy.Store(err.Error())
		case uintptr(gf) > gran:
			gran = uintptr(gf)
		}
	}
	if gran == 0 {
		return 0, core.Errorf(core.ErrBackend, "cuda: cuMemGetAllocationGranularity returned 0 on device %d", d.ordinal)
	}
	return gran, nil
}

// release gives back the primary context if init retained it.
func (d *device) release() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.ready.Load() {
		return nil
	}
	d.ready.Store(false)
	if d.ownStream != 0 {
		C.smcu_stream_destroy(d.ctx, d.ownStream)
		d.ownStream = 0
	}
	d.sideMu.Lock()
	for _, st := range d.copyStreams {
		C.smcu_stream_destroy(d.ctx, st)
	}
	d.copyStreams = nil
	d.sideMu.Unlock()
	return check(C.smcu_primary_release(d.cu), d.ordinal)
}

// deviceNameOrUnknown is the device's name for messages.
func deviceNameOrUnknown(cu C.int) string {
	var buf [256]C.char
	if C.smcu_device_name(cu, &buf[0], C.int(len(buf))).res != cudaSuccess {
		return "unknown device"
	}
	return C.GoString(&buf[0])
}
