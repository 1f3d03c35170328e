package core

import (
	"errors"
	"os"
	"sort"
	"sync"
)

// Note [How blocks are placed]
//
// Requests are rounded up to minBlockSize (512 B, PyTorch's alignment).
// Requests of at most smallRequest go to the small pool, which carves them out
// of smallSegment (2 MiB) segments; larger ones go to the large pool: up to
// midRequest they share largeSegment (20 MiB) segments, beyond it they get a
// segment of their own rounded up to largeRound. These are the sizes PyTorch's
// own caching allocator uses, so a MemPool on top of us (which asks for 2 MiB,
// 20 MiB or rounded segments) and the global-allocator path behave as users
// of PyTorch expect.
//
// Within a pool of a stream the free block chosen is the best fit by
// (size, heap offset). A block is split when the rest is worth keeping (any
// rest in the small pool; more than smallRequest in the large pool) and merged
// with free neighbours when freed, never across segments. New segments go to
// the lowest heap offset where they fit.
//
// Every one of these decisions depends only on the sequence of calls (sizes,
// frees, and streams numbered by first use), never on addresses, timing or
// events: that is DESIGN invariant 2, and it is what makes two ranks that ran
// the same program hold their buffers at the same heap offsets.
const (
	minBlockSize = 512
	smallRequest = 1 << 20
	smallSegment = 2 << 20
	midRequest   = 10 << 20
	largeSegment = 20 << 20
	largeRound   = 2 << 20
	// maxRequest bounds a request before any arithmetic on it can overflow.
	maxRequest = uintptr(1) << 56
)

// block is a range of a segment, allocated or free.
//
// Invariants (Validate checks them):
//   - the blocks of a segment, followed through next, tile it exactly:
//     first.addr == seg.addr, b.next.addr == b.addr+b.size, and the sizes
//     add up to seg.size; prev is the mirror of next;
//   - no two neighbours are both free (free blocks are merged at once);
//   - a free block is in its segment's pool's freeSet, an allocated block is
//     in Allocator.live under its address, and never both;
//   - a cached block (cachedBy != nil) is allocated, in exactly one bin, the
//     one cachedBy names (Note [Thread caches]);
//   - heapOff == seg.heapOff + (addr - seg.addr).
type block struct {
	seg       *segment
	addr      uintptr
	size      uintptr
	heapOff   uint64
	requested uintptr // size asked for; meaningful while allocated
	allocated bool
	prev      *block // neighbour at lower address in seg, or nil
	next      *block // neighbour at higher address in seg, or nil
	// streams lists the streams other than seg.pools.stream recorded by
	// RecordStream while the block was allocated.
	streams []Stream
	// ctx is the context number of the allocation (Note [Heap snapshots
	// and allocation history]); 0 when none was attached.
	ctx uint64
	// cachedBy is the thread cache that holds the block (Note [Thread
	// caches]): allocated for its segment, in the live table, freed for the
	// user. nil when not cached.
	cachedBy ThreadCache

	// freeSet links, meaningful only while the block is free.
	left, right *block
	prio        uint32
}

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
	mem        Memory
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

// streamPools holds the free blocks of one (tag, stream): a tag's blocks
// come from its own segments only (Note [Tags and pause] in tags.go).
type streamPools struct {
	stream Stream
	tag    *tagState
	number int // order of first use: placement keys on this, not the pointer
	small  freeSet
	large  freeSet
}

// poolKey names the pools of a stream within a tag.
type poolKey struct {
	tag    TagID
	stream Stream
}

func (sp *streamPools) pool(small bool) *freeSet {
	if small {
		return &sp.small
	}
	return &sp.large
}

// Allocator is the caching allocator of one device. It is safe for
// concurrent use; every method takes mu.
type Allocator struct {
	mu     sync.Mutex
	be     Backend
	device int
	gran   uintptr
	total  uint64 // the device's physical memory, bounding any request
	heap   heap

	// live maps the address of every allocated block to it.
	live blockTable
	// streams maps a (tag, stream) to its pools; order lists them by first use.
	streams map[poolKey]*streamPools
	order   []*streamPools
	last    *streamPools // the pools of the last stream used (a fast path)

	limit uint64 // reserved bytes never exceed it; 0 = none
	// pinnedAhead is the bytes of host copies pinned ahead for segments
	// that still have them (Note [Pinned ahead]); the sum of size over
	// segments with pinnedAhead set.
	pinnedAhead uint64
	st          stats
	nextSegID   uint64
	allocs      uint64 // successful Alloc calls, for divergence reports
	frees       uint64 // successful Free calls
	spareBlock  []*block
	// tags[id] is the state of tag id here, made at its first allocation
	// on this device (nil before); tags[0] is the untagged memory.
	tags []*tagState
	hist *history // nil unless recording (Note [Heap snapshots and allocation history])
	// leakedSegments counts segments unmapped whose physical memory the
	// backend failed to release.
	leakedSegments int
	// caches are the thread caches that hold blocks of this device or have
	// pending counts (Note [Thread caches]); each at most once.
	caches []ThreadCache

	// hooks run before a segment is released (AddReleaseHook); guarded by
	// hookMu, taken after mu.
	hookMu   sync.Mutex
	hooks    map[uint64]ReleaseHook
	nextHook uint64
}

// ReleaseHook is told about a segment before its memory is unmapped and
// released, once the device has been synchronised: what others registered
// on it (NCCL windows) must be undone there. An error keeps the segment
// (its memory is not released; the release fails with that error).
type ReleaseHook func(seg SegmentInfo) error

// AddReleaseHook adds h; the returned function removes it.
func (a *Allocator) AddReleaseHook(h ReleaseHook) (remove func()) {
	a.hookMu.Lock()
	defer a.hookMu.Unlock()
	if a.hooks == nil {
		a.hooks = map[uint64]ReleaseHook{}
	}
	a.nextHook++
	id := a.nextHook
	a.hooks[id] = h
	return func() {
		a.hookMu.Lock()
		delete(a.hooks, id)
		a.hookMu.Unlock()
	}
}

// runReleaseHooks tells every hook that seg goes (mu held).
func (a *Allocator) runReleaseHooks(seg *segment) error {
	a.hookMu.Lock()
	hooks := make([]ReleaseHook, 0, len(a.hooks))
	for _, h := range a.hooks {
		hooks = append(hooks, h)
	}
	a.hookMu.Unlock()
	info := SegmentInfo{ID: seg.id, Addr: seg.addr, Size: seg.size, HeapOff: seg.heapOff}
	var first error
	for _, h := range hooks {
		if err := h(info); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// NewAllocator makes the allocator of device on be. It reserves the heap's
// first address range lazily, at the first segment.
func NewAllocator(be Backend, device int) (*Allocator, error) {
	if device < 0 || device >= be.DeviceCount() {
		return nil, Errorf(ErrInvalidDevice, "device %d is out of range: the %s backend has %d device(s)", device, be.Name(), be.DeviceCount())
	}
	gran, err := be.Granularity(device)
	if err != nil {
		return nil, err
	}
	_, total, err := be.MemoryInfo(device)
	if err != nil {
		return nil, err
	}
	a := &Allocator{
		be:      be,
		device:  device,
		gran:    gran,
		total:   total,
		streams: make(map[poolKey]*streamPools),
	}
	a.tags = []*tagState{{}}
	a.heap.init(be, device, gran, total)
	if n := historyMax.Load(); n > 0 {
		a.hist = &history{max: int(n)}
	}
	return a, nil
}

// Device is the device index of the allocator.
func (a *Allocator) Device() int { return a.device }

// Backend is the backend the allocator takes memory from.
func (a *Allocator) Backend() Backend { return a.be }

func roundUp(n, to uintptr) uintptr { return (n + to - 1) / to * to }

// roundRequest is the block size for a request of n bytes (0 gets the
// minimum block so that every allocation has a distinct address).
func roundRequest(n uintptr) uintptr {
	if n == 0 {
		return minBlockSize
	}
	return roundUp(n, minBlockSize)
}

// segmentSize is the size of a new segment for a block of size bytes.
func (a *Allocator) segmentSize(size uintptr) uintptr {
	var s uintptr
	switch {
	case size <= smallRequest:
		s = smallSegment
	case size < midRequest:
		s = largeSegment
	default:
		s = roundUp(size, largeRound)
	}
	return roundUp(s, a.gran)
}

// shouldSplit says whether a free block of blockSize serving size bytes
// leaves a rest worth keeping as a block of its own.
func shouldSplit(small bool, blockSize, size uintptr) bool {
	rest := blockSize - size
	if small {
		return rest >= minBlockSize
	}
	return rest > smallRequest
}

func (a *Allocator) poolsOf(t *tagState, s Stream) *streamPools {
	if sp := a.last; sp != nil && sp.stream == s && sp.tag == t {
		return sp
	}
	k := poolKey{t.id, s}
	sp := a.streams[k]
	if sp == nil {
		sp = &streamPools{stream: s, tag: t, number: len(a.order)}
		a.streams[k] = sp
		a.order = append(a.order, sp)
	}
	a.last = sp
	return sp
}

func (a *Allocator) newBlock() *block {
	if n := len(a.spareBlock); n > 0 {
		b := a.spareBlock[n-1]
		a.spareBlock = a.spareBlock[:n-1]
		return b
	}
	return new(block)
}

func (a *Allocator) dropBlock(b *block) {
	*b = block{}
	if len(a.spareBlock) < 1024 {
		a.spareBlock = append(a.spareBlock, b)
	}
}

// Alloc returns the address of a block of at least size bytes for use on
// stream s, untagged.
func (a *Allocator) Alloc(size uintptr, s Stream) (uintptr, error) {
	return a.AllocTagged(size, s, 0)
}

// AllocTagged is Alloc for a block of tag (0: untagged; see RegisterTag),
// taken from that tag's segments only. A paused tag refuses with
// ErrInvalidState.
func (a *Allocator) AllocTagged(size uintptr, s Stream, tag TagID) (uintptr, error) {
	a.lock()
	defer a.mu.Unlock()
	t := a.tags[0]
	if tag != 0 {
		var err error
		if t, err = a.tagLocked(tag); err != nil {
			return 0, err
		}
		if t.paused {
			return 0, Errorf(ErrInvalidState, "%d bytes requested on device %d in tag %q, which is paused: resume it first", size, a.device, t.name)
		}
	}
	if size > maxRequest || uint64(size) > a.total {
		a.st.numOOM++
		return 0, Errorf(ErrOutOfMemory, "%d bytes requested on device %d, which has %d bytes in all (%s backend)", size, a.device, a.total, a.be.Name())
	}
	rounded := roundRequest(size)
	small := rounded <= smallRequest
	sp := a.poolsOf(t, s)
	pool := sp.pool(small)
	b := pool.lowerBound(rounded)
	if b == nil {
		var err error
		if b, err = a.newSegment(a.segmentSize(rounded), sp, small, rounded); err != nil {
			return 0, err
		}
	}
	pool.remove(b)
	a.st.inactiveSplit(b, -1)
	if shouldSplit(small, b.size, rounded) {
		rest := a.newBlock()
		*rest = block{seg: b.seg, addr: b.addr + rounded, size: b.size - rounded,
			heapOff: b.heapOff + uint64(rounded), prev: b, next: b.next}
		if b.next != nil {
			b.next.prev = rest
		}
		b.next = rest
		b.size = rounded
		pool.insert(rest)
		a.st.inactiveSplit(rest, 1)
	}
	b.allocated = true
	b.requested = size
	if b.seg.nAllocated == 0 && b.seg.prepin == nil && b.seg.backup == 0 && !b.seg.pinnedAhead {
		// A segment emptied once gave its host copy back (forgetBackup):
		// it pins one ahead again with its first block, as when it was made.
		a.startPinAhead(b.seg)
	}
	b.seg.nAllocated++
	a.live.put(b.addr, b)
	a.allocs++
	a.st.block(small, 1, int64(b.size), int64(size))
	if a.hist != nil {
		a.record("alloc", b.addr, size, s)
	}
	return b.addr, nil
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
			return nil, Errorf(ErrOutOfMemory, "%d bytes requested on device %d: a new %d-byte segment would exceed the memory limit of %d bytes (%d reserved, %d allocated)",
				request, a.device, size, a.limit, a.st.by[statReservedBytes][poolAll].current, a.st.by[statAllocatedBytes][poolAll].current)
		}
	}
	mem, err := a.be.Create(a.device, size)
	if err != nil && CodeOf(err) == ErrOutOfMemory {
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
		if CodeOf(err) == ErrOutOfMemory {
			a.st.numOOM++
			return nil, Errorf(ErrOutOfMemory, "%d bytes requested on device %d: the %s backend could not create a %d-byte segment (%d bytes reserved by libsymmem, %d allocated): %v",
				request, a.device, a.be.Name(), size, a.st.by[statReservedBytes][poolAll].current, a.st.by[statAllocatedBytes][poolAll].current, err)
		}
		return nil, err
	}
	addr, heapOff, err := a.heap.place(size)
	if err == nil {
		err = a.be.Map(a.device, addr, size, mem)
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

// Free returns the block at ptr. size is checked against the request (0
// skips the check); the block's own stream is used, whatever s says.
func (a *Allocator) Free(ptr uintptr, size uintptr, s Stream) error {
	return a.FreeTo(ptr, size, s, nil)
}

// FreeTo is Free by the thread that owns tc (nil: none), which keeps the
// block when it may (Note [Thread caches]).
func (a *Allocator) FreeTo(ptr uintptr, size uintptr, s Stream, tc ThreadCache) error {
	a.lock()
	defer a.mu.Unlock()
	b := a.live.get(ptr)
	if b == nil || b.cachedBy != nil {
		return a.explainForeign(ptr)
	}
	// A block of a paused segment may be freed: that is bookkeeping only,
	// nothing below touches its memory.
	var mismatch error
	if size != 0 && size != b.requested {
		mismatch = Errorf(ErrInvalidArgument, "free of %#x on device %d: size %d differs from the %d bytes allocated (the block was freed anyway)", ptr, a.device, size, b.requested)
	}
	seg := b.seg
	for _, other := range b.streams {
		if err := a.be.StreamWait(a.device, seg.pools.stream, other); err != nil {
			return err // still allocated: the free did not happen
		}
	}
	a.frees++
	a.st.block(seg.small, -1, int64(b.size), int64(b.requested))
	if a.hist != nil {
		// Freed blocks are reusable at once on their stream (the waits on
		// other streams are enqueued above), so the request completes now.
		a.record("free_requested", b.addr, b.requested, seg.pools.stream)
		a.record("free_completed", b.addr, b.requested, seg.pools.stream)
	}
	if tc != nil && a.cacheable(b) {
		a.cacheLocked(b, tc)
		return mismatch
	}
	a.live.take(ptr)
	a.returnBlockLocked(b)
	return mismatch
}

// returnBlockLocked puts b, allocated for its segment but out of the live
// table and counted as freed, back into its pool, merged with its free
// neighbours.
func (a *Allocator) returnBlockLocked(b *block) {
	seg := b.seg
	small := seg.small
	b.ctx = 0
	b.allocated = false
	b.requested = 0
	b.streams = b.streams[:0]
	seg.nAllocated--
	if seg.nAllocated == 0 {
		a.forgetBackup(seg)
	}
	pool := seg.pools.pool(small)
	if p := b.prev; p != nil && !p.allocated {
		pool.remove(p)
		a.st.inactiveSplit(p, -1)
		a.absorb(p, b)
		b = p
	}
	if n := b.next; n != nil && !n.allocated {
		pool.remove(n)
		a.st.inactiveSplit(n, -1)
		a.absorb(b, n)
	}
	pool.insert(b)
	a.st.inactiveSplit(b, 1)
}

// absorb merges r, the right neighbour of l, into l; neither is in a pool.
func (a *Allocator) absorb(l, r *block) {
	l.size += r.size
	l.next = r.next
	if r.next != nil {
		r.next.prev = l
	}
	a.dropBlock(r)
}

// explainForeign says why ptr is not a live allocation.
func (a *Allocator) explainForeign(ptr uintptr) error {
	if seg := a.heap.segmentAt(ptr); seg != nil {
		for b := seg.first; b != nil; b = b.next {
			if ptr >= b.addr && ptr < b.addr+b.size {
				if b.allocated && b.cachedBy == nil {
					return Errorf(ErrInvalidPointer, "%#x is inside the block at %#x (offset %d) on device %d, not its start: free the pointer symmem_alloc returned", ptr, b.addr, ptr-b.addr, a.device)
				}
				return Errorf(ErrInvalidPointer, "%#x on device %d is not allocated: already freed (double free?)", ptr, a.device)
			}
		}
	}
	return Errorf(ErrInvalidPointer, "%#x was not allocated by libsymmem on device %d", ptr, a.device)
}

// RecordStream notes that the block holding ptr is used on s too: before it
// is reused, its own stream will wait for s's work queued up to its free.
func (a *Allocator) RecordStream(ptr uintptr, s Stream) error {
	a.lock()
	defer a.mu.Unlock()
	b, err := a.lookupLocked(ptr)
	if err != nil {
		return err
	}
	if s == b.seg.pools.stream {
		return nil
	}
	for _, o := range b.streams {
		if o == s {
			return nil
		}
	}
	b.streams = append(b.streams, s)
	return nil
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

// BlockInfo describes an allocated block.
type BlockInfo struct {
	Addr      uintptr
	Size      uintptr
	Requested uintptr
	HeapOff   uint64
	Device    int
	Segment   SegmentInfo
	Allocs    uint64 // the allocator's successful Alloc calls so far
	Frees     uint64 // the allocator's successful Free calls so far
}

func (a *Allocator) lookupLocked(ptr uintptr) (*block, error) {
	if b := a.live.get(ptr); b != nil && b.cachedBy == nil {
		return b, nil
	}
	if seg := a.heap.segmentAt(ptr); seg != nil {
		for b := seg.first; b != nil; b = b.next {
			if ptr >= b.addr && ptr < b.addr+b.size && b.allocated && b.cachedBy == nil {
				return b, nil
			}
		}
	}
	return nil, a.explainForeign(ptr)
}

// Lookup describes the allocated block that holds ptr (its start or inside).
func (a *Allocator) Lookup(ptr uintptr) (BlockInfo, error) {
	a.lock()
	defer a.mu.Unlock()
	b, err := a.lookupLocked(ptr)
	if err != nil {
		return BlockInfo{}, err
	}
	s := b.seg
	return BlockInfo{Addr: b.addr, Size: b.size, Requested: b.requested, HeapOff: b.heapOff,
		Device: a.device, Segment: s.info(),
		Allocs: a.allocs, Frees: a.frees}, nil
}

// ExportSegment returns a new descriptor (the caller closes it) for the
// physical memory of the segment that starts at segAddr.
func (a *Allocator) ExportSegment(segAddr uintptr) (int, error) {
	a.lock()
	defer a.mu.Unlock()
	seg := a.heap.segmentAt(segAddr)
	if seg == nil || seg.addr != segAddr {
		return -1, Errorf(ErrInvalidPointer, "%#x is not the start of a segment on device %d", segAddr, a.device)
	}
	if seg.paused {
		return -1, Errorf(ErrInvalidState, "the segment at %#x on device %d belongs to tag %q, which is paused", segAddr, a.device, seg.pools.tag.name)
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
func (a *Allocator) ExportSegmentWith(segAddr uintptr, export func(m Memory) error) error {
	a.lock()
	defer a.mu.Unlock()
	seg := a.heap.segmentAt(segAddr)
	if seg == nil || seg.addr != segAddr {
		return Errorf(ErrInvalidPointer, "%#x is not the start of a segment on device %d", segAddr, a.device)
	}
	if seg.paused {
		return Errorf(ErrInvalidState, "the segment at %#x on device %d belongs to tag %q, which is paused", segAddr, a.device, seg.pools.tag.name)
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
	if err := a.runReleaseHooks(seg); err != nil {
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
		return Errorf(CodeOf(relErr), "device %d: segment %d (%d bytes at heap offset %#x) was unmapped and left the cache, but its physical memory could not be released (leaked): %v",
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

// SetLimit sets the memory limit (0 = none).
func (a *Allocator) SetLimit(bytes uint64) {
	a.lock()
	a.limit = bytes
	a.mu.Unlock()
}

// Limit is the memory limit (0 = none).
func (a *Allocator) Limit() uint64 {
	a.lock()
	defer a.mu.Unlock()
	return a.limit
}

// TotalMemory is the device's physical memory as the backend reported it.
func (a *Allocator) TotalMemory() uint64 { return a.total }

// Stats returns every statistic, in StatKeys order.
func (a *Allocator) Stats() []Stat {
	a.lock()
	v := a.st.values(a.limit)
	a.mu.Unlock()
	out := make([]Stat, len(v))
	for i := range v {
		out[i] = Stat{StatKeys[i], v[i]}
	}
	return out
}

// StatValues writes the statistics' values, in StatKeys order, into dst
// and returns how many there are in all.
func (a *Allocator) StatValues(dst []int64) int {
	a.lock()
	v := a.st.values(a.limit)
	a.mu.Unlock()
	copy(dst, v)
	return len(v)
}

// ResetPeakStats sets every peak to its current value.
func (a *Allocator) ResetPeakStats() {
	a.lock()
	a.st.resetPeaks()
	a.mu.Unlock()
}

// Counters returns the numbers of successful Alloc and Free calls.
func (a *Allocator) Counters() (allocs, frees uint64) {
	a.lock()
	defer a.mu.Unlock()
	return a.allocs, a.frees
}

// Close releases every segment and the heap, whatever is still allocated.
// Only for tests and process teardown.
func (a *Allocator) Close() error {
	a.lock()
	defer a.mu.Unlock()
	a.drainCachesLocked()
	if err := a.be.SynchronizeDevice(a.device); err != nil {
		return err
	}
	segs := append([]*segment(nil), a.heap.segments...)
	sort.Slice(segs, func(i, j int) bool { return segs[i].heapOff < segs[j].heapOff })
	for _, seg := range segs {
		if !seg.paused {
			_ = a.runReleaseHooks(seg)
			_ = a.be.Unmap(a.device, seg.addr, seg.size)
			_ = a.be.Release(seg.mem)
		}
		a.dropBackup(seg)
	}
	a.heap.segments = nil
	a.live = blockTable{}
	return a.heap.close()
}
