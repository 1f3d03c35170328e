package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
)

// These functions load the driver if no Backend has (LibraryPath) and need
// no context. Device indices are ordinals after CUDA_VISIBLE_DEVICES, as
// for Backend.

// DriverVersion is the CUDA version the driver supports, as
// 1000*major + 10*minor (12040 for 12.4).
func DriverVersion() (int, error) {
	if err := ensureDriver(); err != nil {
		return 0, err
	}
	var v C.int
	if err := check(C.smcu_driver_version(&v), -1); err != nil {
		return 0, err
	}
	return int(v), nil
}

// cuDevice validates ordinal and returns its CUdevice.
func cuDevice(ordinal int) (C.int, error) {
	if err := ensureDriver(); err != nil {
		return 0, err
	}
	var n C.int
	if err := check(C.smcu_device_count(&n), -1); err != nil {
		return 0, err
	}
	if ordinal < 0 || ordinal >= int(n) {
		return 0, core.Errorf(core.ErrInvalidDevice,
			"cuda: device %d does not exist (valid devices are 0..%d)", ordinal, int(n)-1)
	}
	var cu C.int
	if err := check(C.smcu_device_get(C.int(ordinal), &cu), ordinal); err != nil {
		return 0, err
	}
	return cu, nil
}

// DeviceName is the device's product name ("NVIDIA H100 80GB HBM3").
func DeviceName(dev int) (string, error) {
	cu, err := cuDevice(dev)
	if err != nil {
		return "", err
	}
	var buf [256]C.char
	if err := check(C.smcu_device_name(cu, &buf[0], C.int(len(buf))), dev); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// UUID is a device's 16-byte identity, the same in every process whatever
// CUDA_VISIBLE_DEVICES says: compare UUIDs to tell whether two ranks use
// the same GPU.
type UUID [16]byte

// String formats u as nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func (u UUID) String() string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// DeviceUUID is the device's UUID (cuDeviceGetUuid_v2).
func DeviceUUID(dev int) (UUID, error) {
	var u UUID
	cu, err := cuDevice(dev)
	if err != nil {
		return u, err
	}
	var raw [16]C.uchar
	if err := check(C.smcu_device_uuid(cu, &raw[0]), dev); err != nil {
		return u, err
	}
	for i := range raw {
		u[i] = byte(raw[i])
	}
	return u, nil
}

// CanAccessPeer tells whether dev can map and access peer's memory directly
// (cuDeviceCanAccessPeer: NVLink or PCIe P2P). A device can access itself.
func CanAccessPeer(dev, peer int) (bool, error) {
	cu, err := cuDevice(dev)
	if err != nil {
		return false, err
	}
	pcu, err := cuDevice(peer)
	if err != nil {
		return false, err
	}
	if dev == peer {
		return true, nil
	}
	var can C.int
	if err := check(C.smcu_can_access_peer(cu, pcu, &can), dev); err != nil {
		return false, err
	}
	return can != 0, nil
}

// currentContext is the calling OS thread's current context (0 for none);
// tests use it to check that the trampolines restore it.
func currentContext() (uintptr, error) {
	var c C.uintptr_t
	if err := check(C.smcu_current_context(&c), -1); err != nil {
		return 0, err
	}
	return uintptr(c), nil
}

// setCurrentContext makes ctx current on the calling OS thread; tests call
// it with the goroutine locked to its thread.
func setCurrentContext(ctx uintptr) error {
	return check(C.smcu_set_current_context(C.uintptr_t(ctx)), -1)
}

// primaryContext is dev's retained primary context, for tests.
func (b *Backend) primaryContext(dev int) (uintptr, error) {
	d, err := b.device(dev)
	if err != nil {
		return 0, err
	}
	return uintptr(d.ctx), nil
}

// DeviceUUID is DeviceUUID(dev) as a string: the method by which code that
// knows only the core.Backend interface (core/symm) tells GPUs apart across
// processes.
func (b *Backend) DeviceUUID(dev int) (string, error) {
	u, err := DeviceUUID(dev)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}
