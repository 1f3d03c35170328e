package symm

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/ipc"
	"github.com/libsymmem/libsymmem/core/lockrank"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"golang.org/x/sys/unix"
)

// groupMem is the memory of a group that may outlive it (Note [Lifetimes]).
type groupMem struct {
	be      core.Backend
	device  int
	gran    uintptr
	name    string
	rank    int
	world   int
	timeout time.Duration // the group's: bounds memsets and copies (memsetZero, copyOut)
	// live watches the peers' processes for the waits on the pads (Note
	// [Dead peers] in core/ipc); closed with the memory.
	live *ipc.Liveness
	// watch writes the abort word of our device region when a peer exits
	// (cuda; deadpeer.go); nil on the host backend.
	watch *peerWatch
	// abort is the group's abort state (Note [Abort]); it takes no lock
	// that a stuck call may hold.
	abort *abortState

	mu sync.Mutex
	// refs = (1 while the group is not destroyed) + (live handles). The
	// memory is released when it reaches 0.
	refs int
	// maps holds the current mapping of each peer segment slot. Invariant:
	// every entry has refs > 0 (an entry whose count drops to 0 is unmapped
	// and removed at once, or was already replaced by a newer ID and only
	// the handles know it).
	maps map[mapKey]*peerMap
	// pads is nil until the group's first rendezvous makes this rank's pad.
	pads *pads
	// host holds the C-visible pointer arrays of handles; dev their device
	// copies (nil on the host backend, where the host arrays serve both).
	host *slab
	dev  *slab
	// arrays are the live pointer arrays by content (Note [Shared pointer
	// arrays]); every entry has refs > 0.
	arrays map[string]*ptrArrays
	// batch, while set (syncBatch), makes every syncThen of one release share
	// one device synchronisation and its result.
	batch syncResult
	// leaked counts the times memory was left mapped because the device
	// synchronisation before unmapping it failed (syncThen).
	leaked int
}

// mapKey names a peer's segment slot: the segment at heapOff of peer's heap.
type mapKey struct {
	peer    int
	heapOff uint64
}

// peerMap is a peer's segment imported and mapped here.
type peerMap struct {
	key  mapKey
	id   uint64 // the peer's SegmentInfo.ID: which segment occupied the slot
	addr uintptr
	size uintptr
	mem  core.Memory
	// refs counts the handles (and in-flight rendezvous pins) using it;
	// guarded by groupMem.mu.
	refs int
	// paused: a collective pause unmapped and released mem (0 now); addr
	// stays reserved so that handles' pointers stay valid (pause.go).
	paused bool
}

// pads is this rank's signal pad and its mappings of every peer's pad.
// Slot channel*world + sender lives in the receiver's pad.
type pads struct {
	size uintptr // bytes per rank, as requested: a multiple of 4, >= 4*world
	// phys is size plus the library's device region (Note [Pad
	// partition] in core), rounded up to the backend granularity.
	phys uintptr
	own  core.Memory
	// addr[r] is rank r's pad mapped here (addr[rank] is our own);
	// mem[r] the imported memory of peer r. Both meaningful only where
	// ready says so for peers.
	addr []uintptr
	mem  []core.Memory
	// ready is true once every peer's pad is mapped (after the group's
	// first successful rendezvous). Every rank's value is the same: the
	// pad exchange succeeds or is undone on all ranks together.
	ready bool
	// sig counts the signals through these pads (Note [Signals]).
	sig *signalCounts
	// coll serialises the host backend's collectives per collective channel
	// (each channel's device sets take one barrier at a time; View.ChannelLock).
	coll [core.CollChannels]sync.Mutex
	// stopRead is where the host reads this rank's stop word (Note [Failed
	// collectives] in core/symm/coll) with one load: the region's word on
	// backends whose memory is the CPU's, else stopMirror, a pinned host
	// word that kernels copy the stop word into (0 where the backend runs
	// no kernels).
	stopRead, stopMirror uintptr
}

func roundUp(n, to uintptr) uintptr { return (n + to - 1) / to * to }

// importMap imports a peer's descriptor (the backend owns fd from here on)
// and maps size bytes of it in a new reserved range. what names the memory
// and its owner ("rank 1 (pid 42)'s signal pad") in messages. The peer is
// not trusted: memory smaller than size is refused with ErrPeer where the
// backend can tell (core.ImportedSizer).
func (gm *groupMem) importMap(fd int, size uintptr, what string) (addr uintptr, mem core.Memory, err error) {
	mem, err = gm.be.Import(gm.device, fd)
	if err != nil {
		return 0, 0, err
	}
	if sizer, ok := gm.be.(core.ImportedSizer); ok {
		got, err := sizer.ImportedSize(mem)
		if got < uint64(size) {
			err = core.Errorf(core.ErrPeer, "%s arrived as memory of %d bytes, %d were announced: refusing to map it (the peer is broken or lying)", what, got, size)
		} else if err != nil {
			err = core.Errorf(core.CodeOf(err), "%s: %v: refusing to map it", what, err)
		}
		if err != nil {
			gm.be.Release(mem)
			return 0, 0, err
		}
	}
	return gm.mapImported(mem, size, what)
}

// mapImported maps size bytes of imported memory in a new reserved range
// and registers the range (what names it); on failure it releases mem.
func (gm *groupMem) mapImported(mem core.Memory, size uintptr, what string) (addr uintptr, _ core.Memory, err error) {
	if addr, err = core.MapNew(gm.be, gm.device, mem, size); err != nil {
		return 0, 0, err
	}
	core.RegisterRange(addr, size, what)
	return addr, mem, nil
}

// unmapRelease undoes importMap (or a pad's create+map). If Unmap fails,
// the memory stays mapped and reserved (still valid to touch); once it is
// unmapped, a failed Release or Unreserve leaks the handle or the address
// range, and the error says so.
func (gm *groupMem) unmapRelease(addr, size uintptr, mem core.Memory) error {
	core.UnregisterRange(addr)
	return core.UnmapRelease(gm.be, gm.device, addr, size, mem)
}

// sync waits for all work on the device before memory that it may use is
// unmapped (DESIGN invariant 4). A no-op on the host backend.
func (gm *groupMem) sync() error { return gm.be.SynchronizeDevice(gm.device) }

type syncResult struct {
	on   bool // a batch is open
	done bool
	err  error
}

// startBatch starts a release that may unmap several things (mu held): they
// share one device synchronisation (one per peer mapping took as many
// synchronisations, and as many timeouts on a stuck device). The caller
// defers endBatch.
func (gm *groupMem) startBatch() { gm.batch = syncResult{on: true} }

// endBatch ends what startBatch started.
func (gm *groupMem) endBatch() { gm.batch = syncResult{} }

// syncThen runs unmap once the device is synchronised. When the
// synchronisation fails or times out (a peer died with a stream waiting for
// its signal: the GPU may still read or write this memory), nothing is
// unmapped: what is deliberately leaked, and the error says so.
func (gm *groupMem) syncThen(what string, unmap func() error) error {
	var err error
	if gm.batch.on { // one synchronisation serves the whole release
		if !gm.batch.done {
			gm.batch.err, gm.batch.done = gm.sync(), true
		}
		err = gm.batch.err
	} else {
		err = gm.sync()
	}
	if err != nil {
		gm.leaked++
		return core.Errorf(core.CodeOf(err), "group %q: rank %d: %s left mapped (deliberately leaked): the device synchronisation before unmapping failed, so the GPU may still use it: %v",
			gm.name, gm.rank, what, err)
	}
	return unmap()
}

// memsetZero zeroes our memory at addr, bounded by the group's timeout where
// the backend waits for a device (core.BoundedMemOps). On ErrTimeout the
// memset may still run: the caller must leak the memory.
func (gm *groupMem) memsetZero(addr, size uintptr) error {
	if b, ok := gm.be.(core.BoundedMemOps); ok {
		return b.MemsetWithin(gm.device, addr, 0, size, gm.timeout)
	}
	return gm.be.Memset(gm.device, 0, addr, 0, size)
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
func (gm *groupMem) writeWords(ops []core.MemOp) error {
	return gm.be.(core.WordWriter).WriteWordsWithin(gm.device, ops, gm.timeout)
}

// copyOut copies size bytes from src to dst, bounded like memsetZero.
func (gm *groupMem) copyOut(dst, src, size uintptr) error {
	if b, ok := gm.be.(core.BoundedMemOps); ok {
		return b.CopyWithin(gm.device, dst, src, size, gm.timeout)
	}
	return gm.be.Copy(gm.device, 0, dst, src, size)
}

// padUsed is how much of a pad of size bytes the group uses: the users'
// part, the library's device region, the all-to-all's exchange area and,
// where the backend launches kernels, the low-latency buffers (Note [Pad partition] in core).
func (gm *groupMem) padUsed(size uintptr) uintptr {
	if _, ok := gm.be.(core.CollectiveLauncher); ok && core.LowLatencyAreaBytes(gm.world) > 0 {
		return core.LowLatencyOffset(size, gm.world) + core.LowLatencyAreaBytes(gm.world)
	}
	return core.PadEnd(size, gm.world)
}

// makePads creates, maps and zeroes this rank's pad of size bytes.
func (gm *groupMem) makePads(size uintptr) (*pads, error) {
	p := &pads{size: size, phys: roundUp(gm.padUsed(size), gm.gran), addr: make([]uintptr, gm.world), mem: make([]core.Memory, gm.world),
		sig: newSignalCounts(gm.world, int(size)/(4*gm.world))}
	addr, own, err := core.CreateMapped(gm.be, gm.device, p.phys)
	if err != nil {
		return nil, err
	}
	if err := gm.memsetZero(addr, p.phys); err != nil {
		if core.CodeOf(err) == core.ErrTimeout { // it may still write there
			gm.leaked++
			return nil, core.Errorf(core.ErrTimeout, "zeroing the pad: %v; the pad is left mapped (deliberately leaked)", err)
		}
		gm.unmapRelease(addr, p.phys, own)
		return nil, err
	}
	p.own = own
	p.addr[gm.rank] = addr
	core.RegisterRange(addr, p.phys, "this rank's signal pad")
	if err := gm.makeStopMirror(p); err != nil {
		gm.unmapRelease(addr, p.phys, own)
		return nil, err
	}
	return p, nil
}

// makeStopMirror sets where the host reads p's stop word (pads.stopRead):
// a pinned host word where the backend runs kernels on device memory.
func (gm *groupMem) makeStopMirror(p *pads) error {
	region := p.addr[gm.rank] + p.size
	if !gm.be.Capabilities().StreamSignals { // the CPU's memory
		p.stopRead = region + 4*core.DevStopWord
		return nil
	}
	hm, ok := gm.be.(core.HostMemory)
	if _, kernels := gm.be.(core.CollectiveLauncher); !ok || !kernels {
		return nil
	}
	w, err := hm.AllocHost(gm.device, 4)
	if err != nil {
		return core.Errorf(core.CodeOf(err), "group %q: rank %d: the pinned host word that mirrors the collectives' stop word: %v", gm.name, gm.rank, err)
	}
	atomic.StoreUint32((*uint32)(unmanaged.Pointer(w)), 0)
	p.stopRead, p.stopMirror = w, w
	return nil
}

// Note [Pointer arrays in the pad]
//
// Kernels read a handle's pointer arrays from device memory, which comes in
// granules (2 MiB on H200) while a group's arrays take 16 bytes per rank
// per handle. Each group made its own granule for them (cuMemCreate,
// reserve, map, access for every peer GPU): 0.7 to 5.6 ms of group creation
// on 2 H200. The pad is a granule too, of which the pad and the library's
// region use 64 KiB and a few KiB: the device slab is seeded with the rest
// of this rank's pad, so a group's arrays need no memory of their own
// until its handles' arrays outgrow the pad's spare end (more than ~60,000
// live handles at 2 ranks). Peers map our whole pad but only ever touch its
// first padSize + core.DeviceRegionBytes bytes. The pad then lives as long as
// the slab: both go with the group's memory (unrefLocked), and a slab
// tainted by a timed-out copy leaks the pad with it.

// makeDeviceSlab makes the device slab for handles' pointer arrays, seeded
// with the spare end of this rank's pad p, and takes a slot from it so
// that a rank that cannot have one fails group creation (gm.mu held).
func (gm *groupMem) makeDeviceSlab(p *pads) error {
	gm.dev = newDeviceSlab(gm.be, gm.device, gm.gran, uintptr(2*gm.world*8))
	used := roundUp(gm.padUsed(p.size), 256)
	if used < p.phys {
		gm.dev.seed(p.addr[gm.rank]+used, p.phys-used)
	}
	a, err := gm.dev.alloc()
	if err != nil {
		return err
	}
	gm.dev.release(a)
	return nil
}

// dropPeerPads unmaps the peers' pads (ready becomes false).
func (gm *groupMem) dropPeerPads(p *pads) error {
	var errs []error
	for r := range p.addr {
		if r != gm.rank && p.addr[r] != 0 {
			errs = append(errs, gm.unmapRelease(p.addr[r], p.phys, p.mem[r]))
			p.addr[r], p.mem[r] = 0, 0
		}
	}
	p.ready = false
	return errors.Join(errs...)
}

// unref drops a reference (mu held); the last one releases everything,
// once the device is synchronised (or leaks it all if that fails).
func (gm *groupMem) unrefLocked() error {
	gm.refs--
	if gm.refs > 0 {
		return nil
	}
	gm.endLiveness()
	return gm.syncThen("the group's memory (signal pads, peer mappings, pointer arrays)", func() error {
		var errs []error
		for k, m := range gm.maps { // none should remain: handles hold them
			errs = append(errs, gm.dropPeerMap(m))
			delete(gm.maps, k)
		}
		errs = append(errs, gm.dropPadsLocked())
		if gm.host != nil {
			errs = append(errs, gm.host.close())
			gm.host = nil
		}
		return errors.Join(errs...)
	})
}

// dropPadsLocked gives back the pads (the peers' mappings and this rank's
// own) and the device slab seeded with this rank's pad, which go together
// (Note [Pointer arrays in the pad]): a slab tainted by a timed-out copy
// is leaked, and with it the pad that holds its slots. The device is
// synchronised or unused (mu held).
func (gm *groupMem) dropPadsLocked() error {
	gm.abort.setRegion(nil)
	gm.stopWatch()
	var errs []error
	padTainted := gm.dev != nil && gm.dev.tainted && gm.dev.seeded
	if gm.dev != nil {
		errs = append(errs, gm.dev.close())
		gm.dev = nil
	}
	if p := gm.pads; p != nil {
		errs = append(errs, gm.dropPeerPads(p))
		if padTainted {
			gm.leaked++
			errs = append(errs, core.Errorf(core.ErrTimeout, "this rank's signal pad (%d bytes at %#x) left mapped (deliberately leaked): it holds the pointer arrays a timed-out copy may still write", p.phys, p.addr[gm.rank]))
		} else {
			errs = append(errs, gm.unmapRelease(p.addr[gm.rank], p.phys, p.own))
			if p.stopMirror != 0 {
				errs = append(errs, gm.be.(core.HostMemory).FreeHost(gm.device, p.stopMirror, 4))
			}
		}
		gm.pads = nil
	}
	return errors.Join(errs...)
}

// putMapLocked drops one reference to m and unmaps it when none is left
// (after synchronising the device; leaked if that fails).
func (gm *groupMem) putMapLocked(m *peerMap) error {
	m.refs--
	if m.refs > 0 {
		return nil
	}
	if gm.maps[m.key] == m {
		delete(gm.maps, m.key)
	}
	return gm.syncThen(fmt.Sprintf("rank %d's segment at heap offset %#x (%d bytes, mapped at %#x)", m.key.peer, m.key.heapOff, m.size, m.addr),
		func() error { return gm.dropPeerMap(m) })
}

// slab hands out fixed-size slots of memory that Go does not manage, so that
// C may keep pointers to them (the handles' pointer arrays).
type slab struct {
	slot   uintptr
	chunk  uintptr
	get    func(size uintptr) (uintptr, error)
	put    func(addr, size uintptr) error
	chunks []uintptr
	free   []uintptr
	// seeded: slots were also carved from memory the slab does not own
	// (seed: the spare end of the group's pad), which close leaves alone.
	seeded bool
	// tainted: a copy into a slot timed out and may still land, so the
	// chunks are never unmapped (close leaks them, and says so; the owner
	// of seeded memory must leak it too).
	tainted bool
}

func newHostSlab(slot uintptr) *slab {
	return &slab{
		slot:  slot,
		chunk: roundUp(max(slot, 64<<10), uintptr(unix.Getpagesize())),
		get: func(size uintptr) (uintptr, error) {
			p, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				return 0, core.Errorf(core.ErrOutOfMemory, "mmap of %d bytes for handle pointer arrays: %v", size, err)
			}
			return uintptr(p), nil
		},
		put: func(addr, size uintptr) error { return unix.MunmapPtr(unmanaged.Pointer(addr), size) },
	}
}

// newDeviceSlab takes its chunks from the backend (device memory on cuda).
func newDeviceSlab(be core.Backend, device int, gran, slot uintptr) *slab {
	mems := map[uintptr]core.Memory{}
	return &slab{
		slot:  slot,
		chunk: roundUp(slot, gran),
		get: func(size uintptr) (uintptr, error) {
			addr, m, err := core.CreateMapped(be, device, size)
			if err != nil {
				return 0, err
			}
			mems[addr] = m
			return addr, nil
		},
		put: func(addr, size uintptr) error {
			m := mems[addr]
			delete(mems, addr)
			return core.UnmapRelease(be, device, addr, size, m)
		},
	}
}

func (s *slab) alloc() (uintptr, error) {
	if len(s.free) == 0 {
		c, err := s.get(s.chunk)
		if err != nil {
			return 0, err
		}
		s.chunks = append(s.chunks, c)
		for a := c; a+s.slot <= c+s.chunk; a += s.slot {
			s.free = append(s.free, a)
		}
	}
	a := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	return a, nil
}

func (s *slab) release(a uintptr) { s.free = append(s.free, a) }

// seed adds the whole slots of [addr, addr+size), memory that someone else
// owns and that must outlive the slab (close does not give it back).
func (s *slab) seed(addr, size uintptr) {
	for a := addr; a+s.slot <= addr+size; a += s.slot {
		s.free = append(s.free, a)
		s.seeded = true
	}
}

func (s *slab) close() error {
	if s.tainted {
		n := len(s.chunks)
		s.chunks, s.free = nil, nil
		if n == 0 { // only seeded slots: their owner leaks them and says so
			return nil
		}
		return core.Errorf(core.ErrTimeout, "%d chunk(s) of pointer arrays left mapped (deliberately leaked): a copy into them timed out and may still run", n)
	}
	var errs []error
	for _, c := range s.chunks {
		errs = append(errs, s.put(c, s.chunk))
	}
	s.chunks, s.free = nil, nil
	return errors.Join(errs...)
}
