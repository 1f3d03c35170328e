package symm

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
)

// Handle is the result of a rendezvous: every rank's block and signal pad,
// mapped in this process. It stays valid (peers' memory stays mapped) after
// the local block is freed, until Release; the pointer to our own block is
// the allocator's and follows its life. Safe for concurrent use.
type Handle struct {
	gm      *groupMem
	name    string
	rank    int
	world   int
	bufSize uintptr // the block's size, equal on every rank
	offset  uintptr // the rendezvous pointer minus the block's start
	padSize uintptr
	timeout time.Duration
	// bufPtrs[r] is rank r's block mapped here; padPtrs[r] its signal pad.
	bufPtrs []uintptr
	padPtrs []uintptr
	// arr is a slot of gm.host holding bufPtrs then padPtrs, for C;
	// devArr the same in device memory (arr on the host backend).
	arr    uintptr
	devArr uintptr
	arrays *ptrArrays // what arr and devArr belong to
	maps   []*peerMap // the peer mappings we hold a reference to
	// sig counts the signals of the group's pads (shared by its handles).
	sig *signalCounts

	mu       sync.Mutex // serialises Release
	released atomic.Bool
}

// ptrArrays is one slot of the C-visible pointer arrays (every rank's block
// pointer, then every rank's pad pointer) in host memory and its device
// copy. Handles with the same pointers share one (Note [Shared pointer
// arrays]); refs counts them, guarded by groupMem.mu.
type ptrArrays struct {
	key       string
	host, dev uintptr
	refs      int
}

// Note [Shared pointer arrays]
//
// A rendezvous again on the same buffer gets the same pointers. Copying
// them to device memory again is a synchronous host-to-device copy, the
// largest part of a warm rendezvous after the all-gather, so handles whose
// pointers are equal share one pair of arrays: the first makes it, the
// last release frees it. The arrays are read-only to users (symmem.h).

// makeArrays gives h the C-visible pointer arrays (gm.mu held).
func (h *Handle) makeArrays() error {
	gm := h.gm
	key := arraysKey(h.bufPtrs, h.padPtrs)
	if a := gm.arrays[key]; a != nil {
		a.refs++
		h.arrays, h.arr, h.devArr = a, a.host, a.dev
		return nil
	}
	slot := uintptr(2 * h.world * 8)
	if gm.host == nil {
		gm.host = newHostSlab(slot)
	}
	a, err := gm.host.alloc()
	if err != nil {
		return err
	}
	arr := unsafe.Slice((*uintptr)(ptrAt(a)), 2*h.world)
	copy(arr, h.bufPtrs)
	copy(arr[h.world:], h.padPtrs)
	pa := &ptrArrays{key: key, host: a, dev: a, refs: 1}
	if gm.be.Capabilities().DevicePointerArrays {
		if gm.dev == nil {
			gm.dev = newDeviceSlab(gm.be, gm.device, gm.gran, slot)
		}
		d, err := gm.dev.alloc()
		if err == nil {
			if err = gm.be.Copy(gm.device, 0, d, a, slot); err != nil {
				gm.dev.release(d)
			}
		}
		if err != nil {
			gm.host.release(a)
			return err
		}
		pa.dev = d
	}
	if gm.arrays == nil {
		gm.arrays = map[string]*ptrArrays{}
	}
	gm.arrays[key] = pa
	h.arrays, h.arr, h.devArr = pa, pa.host, pa.dev
	return nil
}

// putArrays drops h's reference to its arrays (gm.mu held).
func (h *Handle) putArrays() {
	gm, a := h.gm, h.arrays
	if a == nil {
		return
	}
	h.arrays = nil
	if a.refs--; a.refs > 0 {
		return
	}
	delete(gm.arrays, a.key)
	if gm.host != nil {
		gm.host.release(a.host)
	}
	if gm.dev != nil && a.dev != a.host {
		gm.dev.release(a.dev)
	}
}

func arraysKey(bufs, pads []uintptr) string {
	b := make([]byte, 0, 8*(len(bufs)+len(pads)))
	for _, l := range [][]uintptr{bufs, pads} {
		for _, p := range l {
			b = binary.LittleEndian.AppendUint64(b, uint64(p))
		}
	}
	return string(b)
}

// Release drops the handle: peers' memory is unmapped when no handle uses
// it, and the group's memory goes with its last handle once the group is
// destroyed. A second Release is ErrInvalidState.
func (h *Handle) Release() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released.Load() {
		return core.Errorf(core.ErrInvalidState, "the handle of group %q is already released", h.name)
	}
	h.released.Store(true)
	gm := h.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for _, m := range h.maps {
		keep(gm.putMapLocked(m))
	}
	h.maps = nil
	h.putArrays()
	keep(gm.unrefLocked())
	return first
}

// live fails on a released handle.
func (h *Handle) live() error {
	if h.released.Load() {
		return core.Errorf(core.ErrInvalidState, "the handle of group %q is released", h.name)
	}
	return nil
}

// Rank, World, BufferSize, Offset and SignalPadSize describe the handle.
func (h *Handle) Rank() int              { return h.rank }
func (h *Handle) World() int             { return h.world }
func (h *Handle) BufferSize() uintptr    { return h.bufSize }
func (h *Handle) Offset() uintptr        { return h.offset }
func (h *Handle) SignalPadSize() uintptr { return h.padSize }
func (h *Handle) GroupName() string      { return h.name }

// Channels is the number of signal channels: padSize / (4*world).
func (h *Handle) Channels() int { return int(h.padSize) / (4 * h.world) }

func (h *Handle) checkRank(what string, r int) error {
	if r < 0 || r >= h.world {
		return core.Errorf(core.ErrInvalidArgument, "group %q: %s %d is out of range [0, %d)", h.name, what, r, h.world)
	}
	return nil
}

func (h *Handle) checkChannel(c int) error {
	if n := h.Channels(); c < 0 || c >= n {
		return core.Errorf(core.ErrInvalidArgument, "group %q: channel %d is out of range [0, %d) (signal pads of %d bytes, %d ranks, 4 bytes per slot)", h.name, c, n, h.padSize, h.world)
	}
	return nil
}

// BufferPtr is rank r's block, mapped here.
func (h *Handle) BufferPtr(r int) (uintptr, error) {
	if err := h.checkRank("rank", r); err != nil {
		return 0, err
	}
	return h.bufPtrs[r], nil
}

// SignalPadPtr is rank r's signal pad, mapped here.
func (h *Handle) SignalPadPtr(r int) (uintptr, error) {
	if err := h.checkRank("rank", r); err != nil {
		return 0, err
	}
	return h.padPtrs[r], nil
}

// BufferPtrs returns the addresses of the world-long arrays of block
// pointers in host memory (valid until Release) and in device memory.
func (h *Handle) BufferPtrs() (host, dev uintptr) { return h.arr, h.devArr }

// SignalPadPtrs is BufferPtrs for the signal pads.
func (h *Handle) SignalPadPtrs() (host, dev uintptr) {
	off := uintptr(h.world * 8)
	return h.arr + off, h.devArr + off
}

// Buffers returns a copy of every rank's block address.
func (h *Handle) Buffers() []uintptr { return append([]uintptr(nil), h.bufPtrs...) }

// SignalPads returns a copy of every rank's signal pad address.
func (h *Handle) SignalPads() []uintptr { return append([]uintptr(nil), h.padPtrs...) }
