package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

func init() {
	core.RegisterBackend("cuda", 100, Open)
}

// Backend is core.Backend on the CUDA driver. It is safe for concurrent use,
// except that Close must not run concurrently with other calls.
type Backend struct {
	path   string
	devs   []*device
	closed atomic.Bool

	// owners maps every live allocation handle (created or imported here)
	// to its device, so that Release and Export, which get no device, run
	// in the right context, and so that an unknown or released handle is
	// refused before it reaches the driver.
	owners sync.Map // core.Memory -> int
	// imported holds the live handles that came from another process
	// (Import): their mappings grant access to the mapping device only,
	// since they exist for this process's use of a peer's memory.
	imported sync.Map // core.Memory -> struct{}
	// syncTimeout bounds the host-side waits for the GPU (Synchronize,
	// SynchronizeDevice): SYMMEM_TIMEOUT_MS, 5 minutes by default.
	syncTimeout time.Duration
	// flights holds the synchronisation calls in the driver, one per key
	// (Note [Bounded waits]); guarded by flightsMu.
	flightsMu sync.Mutex
	flights   map[flightKey]*flight
}

func syncTimeoutFromEnv() time.Duration { return core.DefaultTimeout() }

var _ core.Backend = (*Backend)(nil)

// Capabilities: signals are stream operations, kernels need the pointer
// arrays in device memory, and each rank has a device of its own.
func (b *Backend) Capabilities() core.Capabilities {
	return core.Capabilities{StreamSignals: true, DevicePointerArrays: true}
}

// Open is the core.Factory of the cuda backend: New as a core.Backend.
func Open() (core.Backend, error) {
	b, err := New()
	if err != nil {
		return nil, err
	}
	return b, nil
}

// New loads the driver (Note [Libraries loaded at run time]), initialises it and counts devices. It
// fails with core.ErrUnavailable, saying why, when the library cannot be
// loaded, lacks a function, cuInit fails, or there is no device. Devices are
// set up lazily, on first use.
func New() (*Backend, error) {
	path, err := loadDriver()
	if err != nil {
		return nil, err
	}
	var n C.int
	if err := check(C.smcu_device_count(&n), -1); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, core.Errorf(core.ErrUnavailable,
			"cuda: the CUDA driver %s reports no devices (CUDA_VISIBLE_DEVICES=%s)",
			core.Quote(path), core.Quote(os.Getenv("CUDA_VISIBLE_DEVICES")))
	}
	b := &Backend{path: path, devs: make([]*device, n), syncTimeout: syncTimeoutFromEnv()}
	for i := range b.devs {
		var cu C.int
		if err := check(C.smcu_device_get(C.int(i), &cu), i); err != nil {
			return nil, err
		}
		b.devs[i] = &device{ordinal: i, cu: cu}
	}
	return b, nil
}

// Close releases the primary contexts the backend retained. Calls after
// Close fail with core.ErrInvalidState. Memory still allocated is not freed.
// Closing twice is harmless.
func (b *Backend) Close() error {
	b.closed.Store(true)
	var first error
	for _, d := range b.devs {
		if err := d.release(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Library is the path of the driver library the backend was opened with.
func (b *Backend) Library() string { return b.path }

// Name is "cuda".
func (b *Backend) Name() string { return "cuda" }

// DeviceCount is the number of devices the driver reports (after
// CUDA_VISIBLE_DEVICES).
func (b *Backend) DeviceCount() int { return len(b.devs) }

// device validates the index and sets the device up on first use.
func (b *Backend) device(dev int) (*device, error) {
	if dev < 0 || dev >= len(b.devs) {
		return nil, core.Errorf(core.ErrInvalidDevice,
			"cuda: device %d does not exist (valid devices are 0..%d)", dev, len(b.devs)-1)
	}
	if b.closed.Load() {
		return nil, core.Errorf(core.ErrInvalidState, "cuda: the backend is closed")
	}
	d := b.devs[dev]
	if !d.ready.Load() {
		if err := d.init(); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Granularity is the minimum allocation granularity of device (2 MiB on
// H100 and H200).
func (b *Backend) Granularity(dev int) (uintptr, error) {
	d, err := b.device(dev)
	if err != nil {
		return 0, err
	}
	return d.gran, nil
}

// MemoryInfo reports the device's free and total memory (cuMemGetInfo).
func (b *Backend) MemoryInfo(dev int) (free, total uint64, err error) {
	d, err := b.device(dev)
	if err != nil {
		return 0, 0, err
	}
	var f, t C.size_t
	if err := check(C.smcu_mem_info(d.ctx, &f, &t), dev); err != nil {
		return 0, 0, err
	}
	return uint64(f), uint64(t), nil
}

// sizeOK checks that size is a positive multiple of the granularity.
func (d *device) sizeOK(op string, size uintptr) error {
	if size == 0 || size%d.gran != 0 {
		return core.Errorf(core.ErrInvalidArgument,
			"cuda: %s of %d bytes on device %d: the size must be a positive multiple of the granularity (%d bytes)",
			op, size, d.ordinal, d.gran)
	}
	return nil
}

// Reserve reserves size bytes of device address space, aligned to the
// granularity (cuMemAddressReserve).
func (b *Backend) Reserve(dev int, size uintptr) (uintptr, error) {
	d, err := b.device(dev)
	if err != nil {
		return 0, err
	}
	if err := d.sizeOK("Reserve", size); err != nil {
		return 0, err
	}
	var addr C.ulonglong
	if err := check(C.smcu_reserve(d.ctx, C.size_t(size), C.size_t(d.gran), &addr), dev); err != nil {
		return 0, err
	}
	return uintptr(addr), nil
}

// Unreserve gives back a reserved range (cuMemAddressFree).
func (b *Backend) Unreserve(dev int, addr, size uintptr) error {
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	return check(C.smcu_unreserve(d.ctx, C.ulonglong(addr), C.size_t(size)), dev)
}

// Create makes size bytes of pinned device memory, exportable as a POSIX
// file descriptor (and as a fabric handle where the device allows it; Note
// [handle types]).
func (b *Backend) Create(dev int, size uintptr) (core.Memory, error) {
	d, err := b.device(dev)
	if err != nil {
		return 0, err
	}
	if err := d.sizeOK("Create", size); err != nil {
		return 0, err
	}
	var h C.ulonglong
	if state := d.fabric.Load(); state != fabricOff {
		err := check(C.smcu_mem_create(d.ctx, d.cu, handlePOSIX|handleFabric, C.size_t(size), &h), dev)
		if err == nil {
			d.fabric.CompareAndSwap(fabricUntried, fabricOn)
			return b.track(core.Memory(h), dev), nil
		}
		// Once a fabric allocation has succeeded, a failure is a real one;
		// out of memory is out of memory whatever the handle type.
		if state == fabricOn || core.CodeOf(err) == core.ErrOutOfMemory {
			return 0, err
		}
		// Refused before any fabric allocation succeeded: the fabric handle
		// is not available here (no IMEX channel, ...). Fall back for good.
		if d.fabric.CompareAndSwap(fabricUntried, fabricOff) {
			d.fabricWhy.Store(err.Error())
		}
	}
	if err := check(C.smcu_mem_create(d.ctx, d.cu, handlePOSIX, C.size_t(size), &h), dev); err != nil {
		return 0, err
	}
	return b.track(core.Memory(h), dev), nil
}

// FabricHandles tells whether memory created on dev carries a fabric handle
// as well as a POSIX file descriptor, and if not, why. Before the first
// Create on a device that supports them, the answer is (false, "not tried").
func (b *Backend) FabricHandles(dev int) (bool, string, error) {
	d, err := b.device(dev)
	if err != nil {
		return false, "", err
	}
	switch d.fabric.Load() {
	case fabricOn:
		return true, "", nil
	case fabricUntried:
		return false, "not tried yet", nil
	}
	why, _ := d.fabricWhy.Load().(string)
	return false, why, nil
}

// track records that handle m lives on dev.
func (b *Backend) track(m core.Memory, dev int) core.Memory {
	b.owners.Store(m, dev)
	return m
}

// owner is the device of a live handle, or an error for an unknown one.
func (b *Backend) owner(op string, m core.Memory) (*device, error) {
	v, ok := b.owners.Load(m)
	if !ok {
		return nil, core.Errorf(core.ErrInvalidArgument,
			"cuda: %s: memory handle %#x was not created or imported by this backend, or was released", op, uint64(m))
	}
	return b.device(v.(int))
}

// Release frees the handle (cuMemRelease). The physical memory goes away
// when its last mapping is unmapped.
func (b *Backend) Release(m core.Memory) error {
	d, err := b.owner("Release", m)
	if err != nil {
		return err
	}
	// Forget the handle before releasing it, so that a concurrent second
	// Release of the same handle is refused instead of reaching the driver.
	if _, ok := b.owners.LoadAndDelete(m); !ok {
		return core.Errorf(core.ErrInvalidArgument, "cuda: Release: memory handle %#x was released concurrently", uint64(m))
	}
	if err := check(C.smcu_mem_release(d.ctx, C.ulonglong(m)), d.ordinal); err != nil {
		b.owners.Store(m, d.ordinal)
		return err
	}
	b.imported.Delete(m)
	return nil
}

// Map maps m at addr (inside a reserved range) and grants dev read/write
// access to it, and every peer GPU of accessList for memory created here
// (cuMemMap + cuMemSetAccess). A failed access grant is undone.
func (b *Backend) Map(dev int, addr, size uintptr, m core.Memory) error {
	_, imported := b.imported.Load(m)
	return b.mapFor(dev, addr, size, m, imported)
}

// MapOwnDevice is Map granting access to dev alone (core.OwnDeviceMapper):
// the other GPUs of this process cannot read the memory directly, as with
// torch_memory_saver's and vLLM's mappings.
func (b *Backend) MapOwnDevice(dev int, addr, size uintptr, m core.Memory) error {
	return b.mapFor(dev, addr, size, m, true)
}

// mapFor maps m at addr for dev, and for dev's peers unless ownOnly.
func (b *Backend) mapFor(dev int, addr, size uintptr, m core.Memory, ownOnly bool) error {
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	if _, err := b.owner("Map", m); err != nil {
		return err
	}
	access := b.accessList(d)
	if ownOnly {
		access = access[:1]
	}
	return check(C.smcu_map(d.ctx, &access[0], C.int(len(access)), C.ulonglong(addr), C.size_t(size), C.ulonglong(m)), dev)
}

// AccessOf tells whether device peer may read and write the mapping at
// addr, which lies in a mapping made on dev (cuMemGetAccess).
func (b *Backend) AccessOf(dev int, addr uintptr, peer int) (bool, error) {
	d, err := b.device(dev)
	if err != nil {
		return false, err
	}
	pcu, err := cuDevice(peer)
	if err != nil {
		return false, err
	}
	var flags C.ulonglong
	if err := check(C.smcu_mem_access(d.ctx, pcu, C.ulonglong(addr), &flags), dev); err != nil {
		return false, err
	}
	return flags == 3, nil // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
}

// accessList is the devices a mapping on d grants read/write access to: d
// itself, then every device that can access d's memory directly (NVLink or
// PCIe P2P). PyTorch enables peer access for cudaMalloc memory only, and
// VMM memory needs access set per mapping, so without the peers a copy
// between GPUs that PyTorch runs as a peer kernel would fault. Computed once
// per device.
func (b *Backend) accessList(d *device) []C.int {
	d.accessOnce.Do(func() {
		d.access = []C.int{d.cu}
		for peer := range b.devs {
			if peer == d.ordinal || len(d.access) >= C.SMCU_MAX_ACCESS {
				continue
			}
			// cuDevice, not b.device: granting access must not retain (and
			// so take memory on) a peer GPU's context.
			pcu, err := cuDevice(peer)
			if err != nil {
				continue
			}
			if ok, err := CanAccessPeer(peer, d.ordinal); err == nil && ok {
				d.access = append(d.access, pcu)
			}
		}
	})
	return d.access
}

// Unmap removes the mapping at [addr, addr+size) (cuMemUnmap).
func (b *Backend) Unmap(dev int, addr, size uintptr) error {
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	return check(C.smcu_unmap(d.ctx, C.ulonglong(addr), C.size_t(size)), dev)
}

// Export returns a new POSIX file descriptor for m, owned by the caller
// (cuMemExportToShareableHandle).
func (b *Backend) Export(m core.Memory) (int, error) {
	d, err := b.owner("Export", m)
	if err != nil {
		return -1, err
	}
	var fd C.int
	if err := check(C.smcu_export_fd(d.ctx, C.ulonglong(m), &fd), d.ordinal); err != nil {
		return -1, err
	}
	return int(fd), nil
}

// Import turns a peer's exported POSIX file descriptor into a local handle
// on dev (cuMemImportFromShareableHandle). fd is closed in every case.
func (b *Backend) Import(dev int, fd int) (core.Memory, error) {
	if fd < 0 {
		return 0, core.Errorf(core.ErrInvalidArgument, "cuda: Import on device %d: invalid file descriptor %d", dev, fd)
	}
	defer syscall.Close(fd)
	d, err := b.device(dev)
	if err != nil {
		return 0, err
	}
	var h C.ulonglong
	if err := check(C.smcu_import_fd(d.ctx, C.int(fd), &h), dev); err != nil {
		return 0, err
	}
	b.imported.Store(core.Memory(h), struct{}{})
	return b.track(core.Memory(h), dev), nil
}
