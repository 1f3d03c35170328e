package symm

import (
	"errors"
	"sync/atomic"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/lockrank"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// padTable is this rank's signal pad and its mappings of the peers' pads
// (Note [Owners of the group's memory]). Its lock alone guards which pads
// are current and their mutable fields (the peers' entries of addr and
// mem, ready); the rest of a pads value never changes once made, and may be
// read from the value current returns.
type padTable struct {
	ops *memOps
	mu  lockrank.Mutex[lockrank.SignalPads]
	// cur is nil until the group's first rendezvous (or its creation) makes
	// this rank's pad. Stored under mu; loaded without it by the readers of
	// what never changes in a pads (current).
	cur atomic.Pointer[pads]
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
	// ready says so for peers; the peers' entries are the table's.
	addr []uintptr
	mem  []core.Memory
	// ready is true once every peer's pad is mapped (after the group's
	// first successful rendezvous). Every rank's value is the same: the
	// pad exchange succeeds or is undone on all ranks together.
	ready bool
	// sig counts the signals through these pads (Note [Signals]).
	sig *signalCounts
	// stopRead is where the host reads this rank's stop word (Note [Failed
	// collectives] in core/symm/coll) with one load: the region's word on
	// backends whose memory is the CPU's, else stopMirror, a pinned host
	// word that kernels copy the stop word into (0 where the backend runs
	// no kernels).
	stopRead, stopMirror uintptr
}

// current is this rank's pads (nil: none made), for what never changes in
// them.
func (t *padTable) current() *pads { return t.cur.Load() }

// make creates, maps and zeroes this rank's pad of size bytes and makes it
// current.
func (t *padTable) make(size uintptr) (*pads, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, err := t.makeLocked(size)
	if err == nil {
		t.cur.Store(p)
	}
	return p, err
}

// ensure makes this rank's pad of size bytes unless one is current; made
// says it was made now, ready whether the peers' pads are mapped.
func (t *padTable) ensure(size uintptr) (p *pads, made, ready bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p = t.cur.Load(); p != nil {
		return p, false, p.ready, nil
	}
	if p, err = t.makeLocked(size); err != nil {
		return nil, false, false, err
	}
	t.cur.Store(p)
	return p, true, false, nil
}

// makeLocked creates, maps and zeroes a pad of size bytes (mu held).
func (t *padTable) makeLocked(size uintptr) (*pads, error) {
	o := t.ops
	p := &pads{size: size, phys: roundUp(o.padUsed(size), o.gran), addr: make([]uintptr, o.world), mem: make([]core.Memory, o.world),
		sig: newSignalCounts(o.world, int(size)/(4*o.world))}
	addr, own, err := core.CreateMapped(o.be, o.device, p.phys)
	if err != nil {
		return nil, err
	}
	if err := o.memsetZero(addr, p.phys); err != nil {
		if core.CodeOf(err) == core.ErrTimeout { // it may still write there
			o.leaked.Add(1)
			return nil, core.Errorf(core.ErrTimeout, "zeroing the pad: %v; the pad is left mapped (deliberately leaked)", err)
		}
		o.unmapRelease(addr, p.phys, own)
		return nil, err
	}
	p.own = own
	p.addr[o.rank] = addr
	core.RegisterRange(addr, p.phys, "this rank's signal pad")
	if err := t.makeStopMirror(p); err != nil {
		o.unmapRelease(addr, p.phys, own)
		return nil, err
	}
	return p, nil
}

// makeStopMirror sets where the host reads p's stop word (pads.stopRead):
// a pinned host word where the backend runs kernels on device memory.
func (t *padTable) makeStopMirror(p *pads) error {
	o := t.ops
	region := p.addr[o.rank] + p.size
	if !o.be.Capabilities().StreamSignals { // the CPU's memory
		p.stopRead = region + 4*core.DevStopWord
		return nil
	}
	hm, ok := o.be.(core.HostMemory)
	if _, kernels := o.be.(core.CollectiveLauncher); !ok || !kernels {
		return nil
	}
	w, err := hm.AllocHost(o.device, 4)
	if err != nil {
		return core.Errorf(core.CodeOf(err), "group %q: rank %d: the pinned host word that mirrors the collectives' stop word: %v", o.name, o.rank, err)
	}
	atomic.StoreUint32((*uint32)(unmanaged.Pointer(w)), 0)
	p.stopRead, p.stopMirror = w, w
	return nil
}

// mapPeer records peer src's pad, mapped here at addr from mem.
func (t *padTable) mapPeer(src int, addr uintptr, mem core.Memory) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.cur.Load()
	p.addr[src], p.mem[src] = addr, mem
}

// addrs copies every rank's pad address here into dst.
func (t *padTable) addrs(dst []uintptr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	copy(dst, t.cur.Load().addr)
}

// isReady says whether the peers' pads are mapped (false: no pads).
func (t *padTable) isReady() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.cur.Load()
	return p != nil && p.ready
}

// setReady marks the peers' pads mapped and returns the pads.
func (t *padTable) setReady() *pads {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.cur.Load()
	p.ready = true
	return p
}

// dropPeers unmaps the peers' pads (ready becomes false); the device is
// synchronised or has never used them.
func (t *padTable) dropPeers() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dropPeersLocked(t.cur.Load())
}

// dropReadyPeers unmaps the peers' pads where they are mapped, once the
// device is synchronised (left mapped if that fails); ready becomes false
// either way.
func (t *padTable) dropReadyPeers() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.cur.Load()
	if p == nil || !p.ready {
		return nil
	}
	err := t.ops.syncThen(nil, "the peers' signal pads", func() error { return t.dropPeersLocked(p) })
	p.ready = false
	return err
}

// dropPeersLocked unmaps the peers' pads of p (mu held).
func (t *padTable) dropPeersLocked(p *pads) error {
	if p == nil {
		return nil
	}
	var errs []error
	for r := range p.addr {
		if r != t.ops.rank && p.addr[r] != 0 {
			errs = append(errs, t.ops.unmapRelease(p.addr[r], p.phys, p.mem[r]))
			p.addr[r], p.mem[r] = 0, 0
		}
	}
	p.ready = false
	return errors.Join(errs...)
}

// drop gives back the pads, the peers' mappings and this rank's own, and
// leaves none current. With leakOwn (it holds pointer arrays a timed-out
// copy may still write: Note [Pointer arrays in the pad]) this rank's pad
// stays mapped, and the error says so. The device is synchronised or
// unused.
func (t *padTable) drop(leakOwn bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.cur.Load()
	if p == nil {
		return nil
	}
	o := t.ops
	errs := []error{t.dropPeersLocked(p)}
	if leakOwn {
		o.leaked.Add(1)
		errs = append(errs, core.Errorf(core.ErrTimeout, "this rank's signal pad (%d bytes at %#x) left mapped (deliberately leaked): it holds the pointer arrays a timed-out copy may still write", p.phys, p.addr[o.rank]))
	} else {
		errs = append(errs, o.unmapRelease(p.addr[o.rank], p.phys, p.own))
		if p.stopMirror != 0 {
			errs = append(errs, o.be.(core.HostMemory).FreeHost(o.device, p.stopMirror, 4))
		}
	}
	t.cur.Store(nil)
	return errors.Join(errs...)
}

// forget leaves no pads current without giving them back (what a failed
// synchronisation left mapped stays so, leaked).
func (t *padTable) forget() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cur.Store(nil)
}
