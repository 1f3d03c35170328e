package symm

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/lockrank"
)

// memOps is what the group's memory does with the device: import, map,
// unmap, synchronise, bounded copies. Nothing in it changes after the group
// is made but leaked.
type memOps struct {
	be      core.Backend
	device  int
	gran    uintptr
	name    string
	rank    int
	world   int
	timeout time.Duration // the group's: bounds memsets and copies (memsetZero, copyOut)
	// leaked counts the times memory was left mapped because the device
	// synchronisation before unmapping it failed (syncThen), or a copy or
	// memset into it timed out.
	leaked atomic.Int64
}

func roundUp(n, to uintptr) uintptr { return (n + to - 1) / to * to }

// importMap imports a peer's descriptor (the backend owns fd from here on)
// and maps size bytes of it in a new reserved range. what names the memory
// and its owner ("rank 1 (pid 42)'s signal pad") in messages. The peer is
// not trusted: memory smaller than size is refused with ErrPeer where the
// backend can tell (core.ImportedSizer).
func (o *memOps) importMap(fd int, size uintptr, what string) (addr uintptr, mem core.Memory, err error) {
	mem, err = o.be.Import(o.device, fd)
	if err != nil {
		return 0, 0, err
	}
	if sizer, ok := o.be.(core.ImportedSizer); ok {
		got, err := sizer.ImportedSize(mem)
		if got < uint64(size) {
			err = core.Errorf(core.ErrPeer, "%s arrived as memory of %d bytes, %d were announced: refusing to map it (the peer is broken or lying)", what, got, size)
		} else if err != nil {
			err = core.Errorf(core.CodeOf(err), "%s: %v: refusing to map it", what, err)
		}
		if err != nil {
			o.be.Release(mem)
			return 0, 0, err
		}
	}
	return o.mapImported(mem, size, what)
}

// mapImported maps size bytes of imported memory in a new reserved range
// and registers the range (what names it); on failure it releases mem.
func (o *memOps) mapImported(mem core.Memory, size uintptr, what string) (addr uintptr, _ core.Memory, err error) {
	if addr, err = core.MapNew(o.be, o.device, mem, size); err != nil {
		return 0, 0, err
	}
	core.RegisterRange(addr, size, what)
	return addr, mem, nil
}

// unmapRelease undoes importMap (or a pad's create+map). If Unmap fails,
// the memory stays mapped and reserved (still valid to touch); once it is
// unmapped, a failed Release or Unreserve leaks the handle or the address
// range, and the error says so.
func (o *memOps) unmapRelease(addr, size uintptr, mem core.Memory) error {
	core.UnregisterRange(addr)
	return core.UnmapRelease(o.be, o.device, addr, size, mem)
}

// sync waits for all work on the device before memory that it may use is
// unmapped (DESIGN invariant 4). A no-op on the host backend.
func (o *memOps) sync() error { return o.be.SynchronizeDevice(o.device) }

// deviceSync is one release's wait for the device: a release that may unmap
// several things (a handle's peer mappings, then the group's memory) waits
// once and every unmap shares the result (one wait per peer mapping took as
// many waits, and as many timeouts on a stuck device). The zero value has
// not waited yet.
type deviceSync struct {
	done bool
	err  error
}

// syncThen runs unmap once the device is synchronised: through s, which
// waits at most once, or (s nil) with a wait of its own. When the
// synchronisation fails or times out (a peer died with a stream waiting for
// its signal: the GPU may still read or write this memory), nothing is
// unmapped: what is deliberately leaked, and the error says so.
func (o *memOps) syncThen(s *deviceSync, what string, unmap func() error) error {
	var err error
	if s != nil {
		if !s.done {
			s.err, s.done = o.sync(), true
		}
		err = s.err
	} else {
		err = o.sync()
	}
	if err != nil {
		o.leaked.Add(1)
		return core.Errorf(core.CodeOf(err), "group %q: rank %d: %s left mapped (deliberately leaked): the device synchronisation before unmapping failed, so the GPU may still use it: %v",
			o.name, o.rank, what, err)
	}
	return unmap()
}

// memsetZero zeroes our memory at addr, bounded by the group's timeout where
// the backend waits for a device (core.BoundedMemOps). On ErrTimeout the
// memset may still run: the caller must leak the memory.
func (o *memOps) memsetZero(addr, size uintptr) error {
	if b, ok := o.be.(core.BoundedMemOps); ok {
		return b.MemsetWithin(o.device, addr, 0, size, o.timeout)
	}
	return o.be.Memset(o.device, 0, addr, 0, size)
}

// lateCopies keeps pinned the Go buffers of copies that timed out: the copy
// may still land there, so they must never move or be reused.
var lateCopies struct {
	lockrank.Mutex[lockrank.LateCopies]
	pins []*runtime.Pinner
}

// unpinUnlessLate unpins pin after a copy into or out of its buffer that
// returned err, unless err is a timeout: then the buffer stays pinned and
// alive for ever (leaked: the copy may still run).
func unpinUnlessLate(pin *runtime.Pinner, err error) {
	if core.CodeOf(err) != core.ErrTimeout {
		pin.Unpin()
		return
	}
	lateCopies.Lock()
	lateCopies.pins = append(lateCopies.pins, pin)
	lateCopies.Unlock()
}

// writeWords stores each op's word at its address from the device, bounded
// like memsetZero (core.WordWriter; callers check that the backend is one).
func (o *memOps) writeWords(ops []core.MemOp) error {
	return o.be.(core.WordWriter).WriteWordsWithin(o.device, ops, o.timeout)
}

// copyOut copies size bytes from src to dst, bounded like memsetZero.
func (o *memOps) copyOut(dst, src, size uintptr) error {
	if b, ok := o.be.(core.BoundedMemOps); ok {
		return b.CopyWithin(o.device, dst, src, size, o.timeout)
	}
	return o.be.Copy(o.device, 0, dst, src, size)
}

// padUsed is how much of a pad of size bytes the group uses: the users'
// part, the library's device region, the all-to-all's exchange area and,
// where the backend launches kernels, the low-latency buffers (Note [Pad partition] in core).
func (o *memOps) padUsed(size uintptr) uintptr {
	if _, ok := o.be.(core.CollectiveLauncher); ok && core.LowLatencyAreaBytes(o.world) > 0 {
		return core.LowLatencyOffset(size, o.world) + core.LowLatencyAreaBytes(o.world)
	}
	return core.PadEnd(size, o.world)
}
