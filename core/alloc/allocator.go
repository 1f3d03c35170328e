package alloc

import (
	"sort"
	"sync/atomic"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/lockrank"
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
	streams []core.Stream
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

// streamPools holds the free blocks of one (tag, stream): a tag's blocks
// come from its own segments only (Note [Tags and pause] in tags.go).
type streamPools struct {
	stream core.Stream
	tag    *tagState
	number int // order of first use: placement keys on this, not the pointer
	small  freeSet
	large  freeSet
}

// poolKey names the pools of a stream within a tag.
type poolKey struct {
	tag    TagID
	stream core.Stream
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
	mu     lockrank.Mutex[lockrank.Allocator]
	be     core.Backend
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

	// hooks run before a segment is released (AddReleaseHook): a list that
	// AddReleaseHook and its removal replace whole, under hookMu, and that
	// a release reads without a lock. hookMu is taken without mu.
	hookMu   lockrank.Mutex[lockrank.ReleaseHooks]
	hooks    atomic.Pointer[[]releaseHookEntry]
	nextHook uint64
}

// NewAllocator makes the allocator of device on be. It reserves the heap's
// first address range lazily, at the first segment.
func NewAllocator(be core.Backend, device int) (*Allocator, error) {
	if device < 0 || device >= be.DeviceCount() {
		return nil, core.Errorf(core.ErrInvalidDevice, "device %d is out of range: the %s backend has %d device(s)", device, be.Name(), be.DeviceCount())
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
func (a *Allocator) Backend() core.Backend { return a.be }

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

func (a *Allocator) poolsOf(t *tagState, s core.Stream) *streamPools {
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
func (a *Allocator) Alloc(size uintptr, s core.Stream) (uintptr, error) {
	return a.AllocTagged(size, s, 0)
}

// AllocTagged is Alloc for a block of tag (0: untagged; see RegisterTag),
// taken from that tag's segments only. A paused tag refuses with
// ErrInvalidState.
func (a *Allocator) AllocTagged(size uintptr, s core.Stream, tag TagID) (uintptr, error) {
	a.lock()
	defer a.mu.Unlock()
	t := a.tags[0]
	if tag != 0 {
		var err error
		if t, err = a.tagLocked(tag); err != nil {
			return 0, err
		}
		if t.paused {
			return 0, core.Errorf(core.ErrInvalidState, "%d bytes requested on device %d in tag %q, which is paused: resume it first", size, a.device, t.name)
		}
	}
	if size > maxRequest || uint64(size) > a.total {
		a.st.numOOM++
		return 0, core.Errorf(core.ErrOutOfMemory, "%d bytes requested on device %d, which has %d bytes in all (%s backend)", size, a.device, a.total, a.be.Name())
	}
	rounded := roundRequest(size)
	small := rounded <= smallRequest
	sp := a.poolsOf(t, s)
	pool := sp.pool(small)
	if !small && a.st.by[statThreadCache][poolLarge].current != 0 {
		// Large blocks waiting in thread caches go back to the pools
		// before a large request chooses (Note [Thread caches]): the best
		// fit may be one of them, and a worse one would split a block that
		// a later request needs whole.
		a.drainCachesLocked()
	}
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

// Free returns the block at ptr. size is checked against the request (0
// skips the check); the block's own stream is used, whatever s says.
func (a *Allocator) Free(ptr uintptr, size uintptr, s core.Stream) error {
	return a.FreeTo(ptr, size, s, nil)
}

// FreeTo is Free by the thread that owns tc (nil: none), which keeps the
// block when it may (Note [Thread caches]).
func (a *Allocator) FreeTo(ptr uintptr, size uintptr, s core.Stream, tc ThreadCache) error {
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
		mismatch = core.Errorf(core.ErrInvalidArgument, "free of %#x on device %d: size %d differs from the %d bytes allocated (the block was freed anyway)", ptr, a.device, size, b.requested)
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
					return core.Errorf(core.ErrInvalidPointer, "%#x is inside the block at %#x (offset %d) on device %d, not its start: free the pointer symmem_alloc returned", ptr, b.addr, ptr-b.addr, a.device)
				}
				return core.Errorf(core.ErrInvalidPointer, "%#x on device %d is not allocated: already freed (double free?)", ptr, a.device)
			}
		}
	}
	return core.Errorf(core.ErrInvalidPointer, "%#x was not allocated by libsymmem on device %d", ptr, a.device)
}

// RecordStream notes that the block holding ptr is used on s too: before it
// is reused, its own stream will wait for s's work queued up to its free.
func (a *Allocator) RecordStream(ptr uintptr, s core.Stream) error {
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
			_ = a.runReleaseHooks(seg, false)
			_ = a.be.Unmap(a.device, seg.addr, seg.size)
			_ = a.be.Release(seg.mem)
		}
		a.dropBackup(seg)
	}
	a.heap.segments = nil
	a.live = blockTable{}
	return a.heap.close()
}
