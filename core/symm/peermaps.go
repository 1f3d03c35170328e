package symm

import (
	"errors"
	"fmt"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/lockrank"
)

// peerMappings is the table of the peers' segments mapped here (Note
// [Owners of the group's memory]): its lock alone guards maps and the refs,
// paused and mem of every peerMap in it or held by a handle.
type peerMappings struct {
	ops *memOps
	mu  lockrank.Mutex[lockrank.PeerMappings]
	// maps holds the current mapping of each peer segment slot. Invariant:
	// every entry has refs > 0 (an entry whose count drops to 0 is unmapped
	// and removed at once, or was already replaced by a newer ID and only
	// the handles know it).
	maps map[mapKey]*peerMap
}

// mapKey names a peer's segment slot: the segment at heapOff of peer's heap.
type mapKey struct {
	peer    int
	heapOff uint64
}

// peerMap is a peer's segment imported and mapped here. key, id, addr and
// size never change; the rest is its table's (peerMappings.mu).
type peerMap struct {
	key  mapKey
	id   uint64 // the peer's SegmentInfo.ID: which segment occupied the slot
	addr uintptr
	size uintptr
	mem  core.Memory
	// refs counts the handles (and in-flight rendezvous pins) using it.
	refs int
	// paused: a collective pause unmapped and released mem (0 now); addr
	// stays reserved so that handles' pointers stay valid (pause.go).
	paused bool
}

// pin takes a reference to every live mapping of the peers' segments at
// heapOff that this rank holds: pinned[p] is the mapping of peer p, and
// held[p] its segment's ID + 1 (blockRecord.held). Undone by put.
func (t *peerMappings) pin(heapOff uint64, pinned []*peerMap, held []uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for p := range pinned {
		if m := t.maps[mapKey{p, heapOff}]; m != nil && p != t.ops.rank && !m.paused {
			m.refs++ // pinned until undo (Note [Lifetimes])
			pinned[p] = m
			held[p] = m.id + 1
		}
	}
}

// hold takes a handle's reference to the mapping of each peer that mapped
// says the handle maps: fresh[p] where a rendezvous mapped a newer segment
// (it replaces the slot's entry; an older mapping there lives on for the
// handles that use it), else pinned[p]. It returns the handle's mappings.
func (t *peerMappings) hold(fresh, pinned []*peerMap, mapped func(p int) bool) []*peerMap {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*peerMap
	for p := range pinned {
		if !mapped(p) {
			continue
		}
		var m *peerMap
		if fresh != nil {
			m = fresh[p]
		}
		if m != nil {
			t.maps[m.key] = m
		} else {
			m = pinned[p]
		}
		m.refs++
		out = append(out, m)
	}
	return out
}

// put drops one reference to m and unmaps it when none is left (after the
// device synchronisation s; leaked if that fails).
func (t *peerMappings) put(s *deviceSync, m *peerMap) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	m.refs--
	if m.refs > 0 {
		return nil
	}
	if t.maps[m.key] == m {
		delete(t.maps, m.key)
	}
	return t.ops.syncThen(s, fmt.Sprintf("rank %d's segment at heap offset %#x (%d bytes, mapped at %#x)", m.key.peer, m.key.heapOff, m.size, m.addr),
		func() error { return t.dropLocked(m) })
}

// dropAll unmaps every mapping left (none should remain: handles hold
// them); the device is synchronised.
func (t *peerMappings) dropAll() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for k, m := range t.maps {
		errs = append(errs, t.dropLocked(m))
		delete(t.maps, k)
	}
	return errors.Join(errs...)
}

// dropLocked unmaps and releases a peer mapping and gives back its range;
// a paused one has only its range left (mu held).
func (t *peerMappings) dropLocked(m *peerMap) error {
	if m.paused {
		return t.ops.be.Unreserve(t.ops.device, m.addr, m.size)
	}
	return t.ops.unmapRelease(m.addr, m.size, m.mem)
}

// pauseImports is step 3 of a collective pause for the peers' memory:
// every live mapping of a peer's segment that segs[peer] lists (the
// segments of the tag in that rank's record; same ID) is unmapped and
// released, its range kept (Note [Collective pause]).
// An unmap that fails leaves the mapping live (not paused); a release that
// fails leaks the memory of a mapping that is paused all the same. The
// first failure is returned; the others are tried.
func (t *peerMappings) pauseImports(segs [][]alloc.SegmentInfo) error {
	o := t.ops
	t.mu.Lock()
	defer t.mu.Unlock()
	var first error
	for p := range segs {
		for _, s := range segs[p] {
			m := t.maps[mapKey{p, s.HeapOff}]
			if p == o.rank || m == nil || m.id != s.ID || m.paused {
				continue
			}
			if err := o.be.Unmap(o.device, m.addr, m.size); err != nil {
				// Still mapped, still valid to touch: not paused (a
				// later pause tries again).
				if first == nil {
					first = core.Errorf(core.CodeOf(err), "rank %d: unmapping its mapping of rank %d's segment at heap offset %#x failed, so it is left mapped (not paused): %v", o.rank, p, s.HeapOff, err)
				}
				continue
			}
			if err := o.be.Release(m.mem); err != nil && first == nil {
				first = core.Errorf(core.CodeOf(err), "rank %d: its mapping of rank %d's segment at heap offset %#x was unmapped, but the imported memory could not be released (leaked): %v", o.rank, p, s.HeapOff, err)
			}
			m.paused, m.mem = true, 0
		}
	}
	return first
}

// pausedImports lists the paused mappings of the peers' segments, for a
// resume of the tag whose segments lie at the heap offsets tagOffs. With
// dropLive, a live mapping of such a segment (left mapped by a pause whose
// unmap failed, on memory its peer has released) is dropped now and listed
// with the paused ones; a failure to drop one is returned and stops the
// dropping.
func (t *peerMappings) pausedImports(tagOffs map[uint64]bool, dropLive bool) (held []mapKey, err error) {
	o := t.ops
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, m := range t.maps {
		if !m.paused && k.peer != o.rank && tagOffs[k.heapOff] && dropLive && err == nil {
			if uerr := o.be.Unmap(o.device, m.addr, m.size); uerr != nil {
				err = core.Errorf(core.CodeOf(uerr), "rank %d: its mapping of rank %d's segment at heap offset %#x, left mapped by a failed pause, cannot be unmapped: %v", o.rank, k.peer, k.heapOff, uerr)
				continue
			}
			o.be.Release(m.mem) // a failure leaks it: the mapping is gone either way
			m.paused, m.mem = true, 0
		}
		if m.paused {
			held = append(held, k)
		}
	}
	return held, err
}

// lookup is the current mapping of slot k (nil: none).
func (t *peerMappings) lookup(k mapKey) *peerMap {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.maps[k]
}

// remap maps imported memory mem into m's reserved range, which a pause
// left unmapped, and marks m resumed; it releases mem if the map fails.
func (t *peerMappings) remap(m *peerMap, mem core.Memory) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.ops.be.Map(t.ops.device, m.addr, m.size, mem); err != nil {
		t.ops.be.Release(mem)
		return err
	}
	m.mem, m.paused = mem, false
	return nil
}

// repause undoes remap for each of ms: unmapped, released, paused again.
func (t *peerMappings) repause(ms []*peerMap) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range ms {
		t.ops.be.Unmap(t.ops.device, m.addr, m.size)
		t.ops.be.Release(m.mem)
		m.mem, m.paused = 0, true
	}
}
