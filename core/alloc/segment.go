package alloc

import (
	"errors"
	"os"
	"slices"

	"github.com/libsymmem/libsymmem/core"
)

// Segments: what one is, how one is made, exported to peers and released,
// and the hooks that others (NCCL windows) run before its memory goes.

// segment is one piece of physical memory mapped at [addr, addr+size) of the
// heap.
//
// Invariant: a segment belongs to one stream's pools and one pool (small or
// large) for its whole life; nAllocated counts its allocated blocks, so it is
// idle (releasable) exactly when nAllocated == 0.
type segment struct {
	id         uint64 // creation number in this allocator, never reused
	addr       uintptr
	size       uintptr
	heapOff    uint64
	mem        core.Memory
	pools      *streamPools
	small      bool
	first      *block
	nAllocated int
	// paused: the segment's physical memory was released by Pause (mem is
	// 0, [addr, addr+size) stays reserved in the heap, blocks keep their
	// bookkeeping); Resume maps new memory there. Counted in paused_bytes,
	// not reserved_bytes.
	paused bool
	// exported: a descriptor of mem went to another process
	// (ExportSegment), so only a collective pause may release it.
	exported bool
	// backup is the host copy of the segment (size bytes, kept for the
	// next cycle; 0 = none yet); backupPinned says it came from HostMemory
	// (else a mapping: anonymous, or of backupFile for a disk backup); backupValid that it holds what the last pause
	// saved, so a resume restores it (else zero-fills). prepin is the copy
	// being pinned ahead, pinnedAhead that the segment counts in
	// Allocator.pinnedAhead (Note [Pinned ahead]).
	backup       uintptr
	backupPinned bool
	backupFile   *os.File // the file of a disk backup (BackupDisk)
	backupValid  bool
	prepin       *prepin
	pinnedAhead  bool
	// backupRetained: a resume retained the copy at its address
	// (ResumeRetainBackup); a later pause must not move it.
	backupRetained bool
	// unmapped is set once the backend has unmapped the segment; from then
	// on it must be in no pool and not in the heap (Validate checks it).
	unmapped bool
}

// ReleaseHook is told about a segment immediately before its memory is
// unmapped and released, once the device has been synchronised: what
// others registered on it (NCCL windows) must be undone there. seg.Paused
// says that the release is a pause's: the segment stays, and a resume maps
// new memory at its address. An error keeps the segment (its memory is not
// released; the release fails with that error), and a hook that fails must
// leave its own registration in place (Note [Releasing a paused tag]).
type ReleaseHook func(seg SegmentInfo) error

// releaseHookEntry is a hook with the number that removes it.
type releaseHookEntry struct {
	id   uint64
	hook ReleaseHook
}

// AddReleaseHook adds h; the returned function removes it. A group over a
// communicator registers its window deregistration here, once, when it is
// made (Note [Window registration] in core/symm).
func (a *Allocator) AddReleaseHook(h ReleaseHook) (remove func()) {
	a.hookMu.Lock()
	defer a.hookMu.Unlock()
	a.nextHook++
	id := a.nextHook
	a.setHooksLocked(append(a.hookList(), releaseHookEntry{id, h}))
	return func() {
		a.hookMu.Lock()
		defer a.hookMu.Unlock()
		var kept []releaseHookEntry
		for _, e := range a.hookList() {
			if e.id != id {
				kept = append(kept, e)
			}
		}
		a.setHooksLocked(kept)
	}
}

// hookList is the current list of release hooks; callers never change it.
func (a *Allocator) hookList() []releaseHookEntry {
	if l := a.hooks.Load(); l != nil {
		return *l
	}
	return nil
}

// setHooksLocked publishes l, a fresh slice, as the list (hookMu held).
func (a *Allocator) setHooksLocked(l []releaseHookEntry) {
	l = slices.Clip(l)
	a.hooks.Store(&l)
}

// runReleaseHooks tells every hook that seg's memory goes, for a pause
// where pausing (mu held; it takes no lock of its own).
func (a *Allocator) runReleaseHooks(seg *segment, pausing bool) error {
	hooks := a.hookList()
	if len(hooks) == 0 {
		return nil
	}
	info := seg.info()
	info.Paused = pausing
	var first error
	for _, e := range hooks {
		if err := e.hook(info); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// newSegment maps a new segment of size bytes for sp's pool and returns its
// one free block. Under a memory limit or when the backend runs out, it
// first releases idle cached segments and tries once more; when that gave
// thread-cached blocks back (Note [Thread caches]) and one of them now fits
// the request, it returns that free block instead.
func (a *Allocator) newSegment(size uintptr, sp *streamPools, small bool, request uintptr) (*block, error) {
	overLimit := func() bool {
		return a.limit != 0 && uint64(a.st.by[statReservedBytes][poolAll].current)+uint64(size) > a.limit
	}
	drained := func() *block {
		if a.st.by[statThreadCache][poolAll].current == 0 {
			return nil
		}
		a.drainCachesLocked()
		return sp.pool(small).lowerBound(request)
	}
	if overLimit() {
		a.st.numAllocRetry++
		if b := drained(); b != nil {
			return b, nil
		}
		if err := a.releaseIdle(); err != nil {
			return nil, err
		}
		if overLimit() {
			a.st.numOOM++
			return nil, core.Errorf(core.ErrOutOfMemory, "%d bytes requested on device %d: a new %d-byte segment would exceed the memory limit of %d bytes (%d reserved, %d allocated)",
				request, a.device, size, a.limit, a.st.by[statReservedBytes][poolAll].current, a.st.by[statAllocatedBytes][poolAll].current)
		}
	}
	mem, err := a.be.Create(a.device, size)
	if err != nil && core.CodeOf(err) == core.ErrOutOfMemory {
		a.st.numAllocRetry++
		if b := drained(); b != nil {
			return b, nil
		}
		if rerr := a.releaseIdle(); rerr != nil {
			return nil, rerr
		}
		mem, err = a.be.Create(a.device, size)
	}
	if err != nil {
		if core.CodeOf(err) == core.ErrOutOfMemory {
			a.st.numOOM++
			return nil, core.Errorf(core.ErrOutOfMemory, "%d bytes requested on device %d: the %s backend could not create a %d-byte segment (%d bytes reserved by libsymmem, %d allocated): %v",
				request, a.device, a.be.Name(), size, a.st.by[statReservedBytes][poolAll].current, a.st.by[statAllocatedBytes][poolAll].current, err)
		}
		return nil, err
	}
	addr, heapOff, err := a.heap.place(size)
	if err == nil {
		err = a.mapSegment(sp.tag, addr, size, mem)
		if err != nil {
			a.heap.remove(heapOff)
		}
	}
	if err != nil {
		_ = a.be.Release(mem)
		return nil, err
	}
	a.nextSegID++
	seg := &segment{id: a.nextSegID, addr: addr, size: size, heapOff: heapOff, mem: mem, pools: sp, small: small}
	b := a.newBlock()
	*b = block{seg: seg, addr: addr, size: size, heapOff: heapOff}
	seg.first = b
	a.heap.add(seg)
	sp.pool(small).insert(b)
	a.startPinAhead(seg)
	a.st.numDeviceAlloc++
	if a.hist != nil {
		a.record("segment_alloc", addr, size, sp.stream)
	}
	a.st.add(statSegment, small, 1)
	a.st.add(statReservedBytes, small, int64(size))
	return b, nil
}

// SegmentInfo describes a segment as peers see it.
type SegmentInfo struct {
	ID      uint64 // creation number, never reused in this allocator
	Addr    uintptr
	Size    uintptr
	HeapOff uint64
	Tag     string // the segment's tag ("" = untagged)
	Paused  bool   // its physical memory is released (Pause)
}

// SegmentAt describes the segment whose address range holds addr, paused
// or not; false where no segment of this allocator's heap does.
func (a *Allocator) SegmentAt(addr uintptr) (SegmentInfo, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if seg := a.heap.segmentAt(addr); seg != nil {
		return seg.info(), true
	}
	return SegmentInfo{}, false
}

// ExportSegment returns a new descriptor (the caller closes it) for the
// physical memory of the segment that starts at segAddr.
func (a *Allocator) ExportSegment(segAddr uintptr) (int, error) {
	a.lock()
	defer a.mu.Unlock()
	seg := a.heap.segmentAt(segAddr)
	if seg == nil || seg.addr != segAddr {
		return -1, core.Errorf(core.ErrInvalidPointer, "%#x is not the start of a segment on device %d", segAddr, a.device)
	}
	if seg.paused {
		return -1, core.Errorf(core.ErrInvalidState, "the segment at %#x on device %d belongs to tag %q, which is paused", segAddr, a.device, seg.pools.tag.name)
	}
	fd, err := a.be.Export(seg.mem)
	if err == nil {
		seg.exported = true
	}
	return fd, err
}

// ExportSegmentWith is ExportSegment for another kind of handle: export
// runs on the segment's memory, under the allocator's lock (so that the
// segment cannot go meanwhile), and the segment counts as exported.
func (a *Allocator) ExportSegmentWith(segAddr uintptr, export func(m core.Memory) error) error {
	a.lock()
	defer a.mu.Unlock()
	seg := a.heap.segmentAt(segAddr)
	if seg == nil || seg.addr != segAddr {
		return core.Errorf(core.ErrInvalidPointer, "%#x is not the start of a segment on device %d", segAddr, a.device)
	}
	if seg.paused {
		return core.Errorf(core.ErrInvalidState, "the segment at %#x on device %d belongs to tag %q, which is paused", segAddr, a.device, seg.pools.tag.name)
	}
	err := export(seg.mem)
	if err == nil {
		seg.exported = true
	}
	return err
}

// releaseIdle releases every segment with no allocated block, after waiting
// for all work on the device (DESIGN invariant 4). Which segments go depends
// only on the allocator's state, never on timing.
func (a *Allocator) releaseIdle() error {
	a.drainCachesLocked() // cached blocks keep their segments busy
	var idle []*segment
	for _, seg := range a.heap.segments {
		// A paused segment holds no memory: it stays until its tag resumes.
		if seg.nAllocated == 0 && !seg.paused {
			idle = append(idle, seg)
		}
	}
	if len(idle) == 0 {
		return nil
	}
	a.st.numSyncAll++
	if err := a.be.SynchronizeDevice(a.device); err != nil {
		return err
	}
	var errs []error
	for _, seg := range idle {
		errs = append(errs, a.releaseSegment(seg))
	}
	return errors.Join(errs...)
}

// releaseSegment unmaps and releases an idle segment. If Unmap fails, the
// segment stays mapped and in the pool (still usable). Once Unmap has
// succeeded the segment leaves the pool and the heap whatever Release says:
// its addresses no longer hold memory, and handing them out would fault. A
// failed Release then leaks the physical memory, and the error says so.
func (a *Allocator) releaseSegment(seg *segment) error {
	if err := a.runReleaseHooks(seg, false); err != nil {
		return err
	}
	if err := a.be.Unmap(a.device, seg.addr, seg.size); err != nil {
		return err
	}
	seg.unmapped = true
	relErr := a.be.Release(seg.mem)
	a.dropBackup(seg)
	seg.pools.pool(seg.small).remove(seg.first)
	a.dropBlock(seg.first)
	a.heap.remove(seg.heapOff)
	a.st.numDeviceFree++
	if a.hist != nil {
		a.record("segment_free", seg.addr, seg.size, seg.pools.stream)
	}
	a.st.add(statSegment, seg.small, -1)
	a.st.add(statReservedBytes, seg.small, -int64(seg.size))
	if relErr != nil {
		a.leakedSegments++
		return core.Errorf(core.CodeOf(relErr), "device %d: segment %d (%d bytes at heap offset %#x) was unmapped and left the cache, but its physical memory could not be released (leaked): %v",
			a.device, seg.id, seg.size, seg.heapOff, relErr)
	}
	return nil
}

// EmptyCache releases every segment that holds no allocated block.
func (a *Allocator) EmptyCache() error {
	a.lock()
	defer a.mu.Unlock()
	return a.releaseIdle()
}
