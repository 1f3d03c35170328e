package symm

import (
	"encoding/binary"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
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
	// arr is a slot of gm.arrays' host slab holding bufPtrs then padPtrs, for C;
	// devArr the same in device memory (arr on the host backend).
	arr    uintptr
	devArr uintptr
	// arrays is the shared entry arr and devArr belong to once filled
	// (Note [Shared pointer arrays]); nil while they are this handle's own.
	arrays *ptrArrays
	maps   []*peerMap // the peer mappings we hold a reference to
	// sig counts the signals of the group's pads (shared by its handles).
	sig *signalCounts
	// stopRead and stopMirror are the group's pads' (pads.stopRead,
	// pads.stopMirror).
	stopRead, stopMirror uintptr
	// span reaches the ranks on other machines; nil on one machine (Note
	// [Collectives across machines]).
	span *span
	// teamArr and teamDevArr, on a handle of a group that spans machines,
	// are the pointer arrays of its team view (Note [Team view] in
	// core/symm/coll): the team's blocks then pads, in host memory and in
	// device memory (teamArr on the host backend); 0 otherwise.
	teamArr, teamDevArr uintptr

	// window is our segment's NCCL window on groups over a communicator
	// (nil otherwise), windowOffset the rendezvous pointer's offset in it.
	// Its ncclWindow_t is 0 while the segment is paused and once it is
	// released.
	window       *window
	windowOffset uintptr

	// sym is the handle's description for the collectives (describe),
	// made when the rendezvous completes and never changed after.
	sym core.SymmetricBuffer

	// barrierDsts and barrierSrcs are barrierRounds(), made with the
	// handle: every barrier's rounds.
	barrierDsts, barrierSrcs [][]int

	// life counts the calls in flight that touch the pads, so that Release
	// never unmaps under them (Note [Calls in flight]).
	life lifetime
}

// allocArrays takes the handle's slots for the C-visible pointer arrays
// (from gm.arrays): host memory, and device memory where the backend's kernels
// need it. Taken before the rendezvous's shared verdict, so that a rank
// that cannot get them fails every rank (Note [Why every verdict is
// shared]).
func (h *Handle) allocArrays() error {
	var err error
	if h.arr, h.devArr, err = h.gm.arrays.take(h.world); err != nil {
		return err
	}
	if h.span != nil { // the team view's (Note [Team view] in core/symm/coll)
		if h.teamArr, h.teamDevArr, err = h.gm.arrays.take(h.world); err != nil {
			h.gm.arrays.give(h.arr, h.devArr)
			h.arr, h.devArr = 0, 0
			return err
		}
	}
	return nil
}

// Note [Shared pointer arrays]
//
// A rendezvous again on the same buffer gets the same pointers. Copying
// them to device memory again is a synchronous host-to-device copy, the
// largest part of a warm rendezvous after the all-gather, so handles whose
// pointers are equal share one pair of filled arrays: the first fills them,
// a later one gives back the slots allocArrays took for it (they were taken
// only so that a rank without memory for them fails every rank) and uses
// the shared pair; the last release frees it. The arrays are read-only to
// users (symmem.h).

// fillArrays writes bufPtrs and padPtrs into the arrays (and copies them to
// the device copy), or shares equal arrays already filled. The group's
// collective lock is held: no other handle fills arrays meanwhile.
func (h *Handle) fillArrays() error {
	gm := h.gm
	var kb [16 * 8]byte // the key of up to 8 ranks without an allocation
	key := arraysKey(kb[:0], h.bufPtrs, h.padPtrs)
	if a := gm.arrays.share(key); a != nil {
		h.freeArrays()
		h.arrays, h.arr, h.devArr = a, a.host, a.dev
		h.teamArr, h.teamDevArr = a.teamHost, a.teamDev
		return nil
	}
	arr := unsafe.Slice((*uintptr)(unmanaged.Pointer(h.arr)), 2*h.world)
	copy(arr, h.bufPtrs)
	copy(arr[h.world:], h.padPtrs)
	if err := gm.arrays.copyArrays(h.devArr, h.arr, h.world); err != nil {
		return err
	}
	if h.teamArr != 0 {
		h.teamPtrs(h.teamArr)
		if err := gm.arrays.copyArrays(h.teamDevArr, h.teamArr, len(h.span.team)); err != nil {
			return err
		}
	}
	h.arrays = &ptrArrays{key: string(key), host: h.arr, dev: h.devArr, teamHost: h.teamArr, teamDev: h.teamDevArr}
	gm.arrays.publish(h.arrays)
	return nil
}

// teamPtrs writes the team's buffer and pad pointers into host slot a.
func (h *Handle) teamPtrs(a uintptr) {
	l := len(h.span.team)
	arr := unsafe.Slice((*uintptr)(unmanaged.Pointer(a)), 2*l)
	for i, r := range h.span.team {
		arr[i], arr[l+i] = h.bufPtrs[r], h.padPtrs[r]
	}
}

// arraysKey appends the key of pointerArrays.byContent for these pointers to b.
func arraysKey(b []byte, bufs, pads []uintptr) []byte {
	for _, p := range bufs {
		b = binary.LittleEndian.AppendUint64(b, uint64(p))
	}
	for _, p := range pads {
		b = binary.LittleEndian.AppendUint64(b, uint64(p))
	}
	return b
}

// freeArrays gives the slots back: this handle's own, or its reference to
// shared ones.
func (h *Handle) freeArrays() {
	if a := h.arrays; a != nil {
		h.arrays = nil
		h.gm.arrays.unshare(a)
	} else {
		h.gm.arrays.give(h.arr, h.devArr)
		h.gm.arrays.give(h.teamArr, h.teamDevArr)
	}
	h.arr, h.devArr, h.teamArr, h.teamDevArr = 0, 0, 0, 0
}

// Release drops the handle: peers' memory is unmapped when no handle uses
// it, and the group's memory goes with its last handle once the group is
// destroyed. Calls in flight on the handle on other threads are made to
// return first (Note [Calls in flight]): a host-side wait gives up with
// ErrInvalidState, and Release waits for them up to the group's timeout; if
// some are still in flight then, the handle's memory is left mapped
// (leaked) and the error says so. A second Release is ErrInvalidState.
func (h *Handle) Release() error {
	if !h.life.close() {
		return core.Errorf(core.ErrInvalidState, "the handle of group %q is already released", h.name)
	}
	if n := h.life.drain(h.timeout); n > 0 {
		return core.Errorf(core.ErrTimeout, "group %q: rank %d released a handle while %d call(s) on it were still in flight after %v; its memory is left mapped (deliberately leaked) so that they cannot fault",
			h.name, h.rank, n, h.timeout)
	}
	maps := h.maps
	h.maps = nil
	return h.gm.release(maps, h.freeArrays)
}

// enter admits a call that touches the handle's memory (the caller defers
// h.life.leave()), or fails on a released handle.
func (h *Handle) enter() error {
	if !h.life.enter() {
		return h.releasedErr()
	}
	if h.gm.abort.aborted() { // Note [Abort]
		h.life.leave()
		return h.gm.abortedErr("a call on a handle")
	}
	return nil
}

func (h *Handle) releasedErr() error {
	return core.Errorf(core.ErrInvalidState, "the handle of group %q is released", h.name)
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

// MappedPeers is the number of peers whose block and pad this process maps:
// the other ranks of its local team (Note [Local teams]).
func (h *Handle) MappedPeers() int { return len(h.maps) }

// BufferPtr is rank r's block, mapped here (0 for a rank on another
// machine).
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

// Window is the NCCL window (an ncclWindow_t) that holds the buffer, and
// the rendezvous pointer's offset in it; 0, 0 when the group has no
// communicator or windows are off. The window is the current one: a pause
// deregisters it (ErrInvalidState until the resume) and the resume
// registers another, so callers ask again after a resume. A segment that
// a failed pause left mapped keeps its window, or, where its unmap failed
// after the window went, is ErrInvalidState saying so (Note [Window
// registration]).
func (h *Handle) Window() (win, offset uintptr, err error) {
	if h.window == nil {
		return 0, 0, nil
	}
	if win = h.window.win.Load(); win == 0 {
		if h.window.mapped() {
			return 0, 0, core.Errorf(core.ErrInvalidState, "the buffer of group %q is in a segment that a failed pause left mapped on rank %d, without its NCCL window (deregistered before the segment's unmap failed; the other ranks released theirs): call the group's resume (symmem_resume_group) on every rank, which registers the window again, then ask again", h.name, h.rank)
		}
		return 0, 0, core.Errorf(core.ErrInvalidState, "the buffer of group %q is in a paused tag: its NCCL window was deregistered with its memory, and the resume registers a new one (ask again then)", h.name)
	}
	return win, h.windowOffset, nil
}

// describe makes the handle's description once its pointer arrays are
// filled (makeHandle); attached is the group's place for the collectives'
// state.
func (h *Handle) describe(attached *core.Attachment) core.SymmetricBuffer {
	d := core.SymmetricBuffer{GroupName: h.name, Rank: h.rank, World: h.world, Timeout: h.timeout,
		BufferSize: h.bufSize, Offset: h.offset, SignalPadSize: h.padSize,
		Buffers: h.bufPtrs, SignalPads: h.padPtrs, StopMirror: h.stopMirror,
		Backend: h.gm.be, Device: h.gm.device, Attached: attached}
	_, d.BufferArray = h.BufferPtrs()
	_, d.PadArray = h.SignalPadPtrs()
	if h.span != nil {
		d.Span = &h.span.across
		if h.teamDevArr != 0 {
			d.TeamBufferArray, d.TeamPadArray = h.teamDevArr, h.teamDevArr+uintptr(8*len(h.span.team))
		}
	}
	return d
}

// barrierDissemination selects the dissemination barrier (read once).
var barrierDissemination = core.Current().Text("SYMMEM_BARRIER", "linear") == "dissemination"

// barrierRounds returns the (dst, src) pairs of each step of a barrier:
// one step of every peer (linear) or one per dissemination round.
func (h *Handle) barrierRounds() (dsts, srcs [][]int) {
	if !barrierDissemination || h.world <= 2 {
		d, s := make([]int, h.world-1), make([]int, h.world-1)
		// Puts to the next rank first, so that ranks do not all hit rank 0
		// first; waits in the reverse order.
		for i := 1; i < h.world; i++ {
			d[i-1], s[i-1] = (h.rank+i)%h.world, (h.rank+h.world-i)%h.world
		}
		return [][]int{d}, [][]int{s}
	}
	for dist := 1; dist < h.world; dist *= 2 {
		dsts = append(dsts, []int{(h.rank + dist) % h.world})
		srcs = append(srcs, []int{(h.rank + h.world - dist%h.world) % h.world})
	}
	return dsts, srcs
}
