package alloc

import "github.com/libsymmem/libsymmem/core"

// Note [Thread caches]
//
// A thread cache is one thread's bin of recently freed blocks of one device,
// kept outside the core (export/tcache.c holds them in C so that a
// symmem_alloc that finds a block there, and the symmem_free of that block,
// never enter Go). The core still owns every block: a block in a bin is
// "cached" (block.cachedBy is its bin): it stays in the live table, keeps its
// place in its segment (allocated as far as the segment, merging and
// releasing are concerned: it is in no free set and counts in
// seg.nAllocated), and for the user it is freed: it counts in the
// allocation, *_bytes statistics as freed and in thread_cache and
// thread_cache_bytes instead.
//
// Only Free puts a block in a bin: the bin of the thread that frees it,
// when the block is untagged, has no recorded streams, fits its request
// exactly (size == roundRequest(requested), so a hit gives the same rounded
// size), is at most MaxCachedBlock, and history is not recorded. A full bin
// gives its oldest available block back to the pools first.
//
// The fast path (outside Go) may then, under the bin's lock:
//   - hit: hand out an available entry of the same (stream, size), the
//     newest first, marking it Out with the size asked; and
//   - undo: take back an Out entry freed by the same thread, which becomes
//     available again at the top;
// and it counts what it did in the bin's CachePending. The core sees none of
// it until it syncs (syncCachesLocked): every method of the Allocator that
// reads or changes state does that first, under mu. Syncing a bin turns its
// Out entries into allocated blocks (requested = the size asked), applies its
// pending counts to the statistics (so every count is exact when read, and
// every peak is the peak of one order of the calls consistent with each
// thread's own order: each bin's hits in turn, at the current value when the
// core syncs it), and adopts the bin if its thread has exited: its available
// blocks go back to the pools and the bin is retired for reuse.
//
// Placement with caches is a pure function of each thread's calls (its bin
// is filled by its own frees and emptied by its own allocations, newest
// first), not the placement without them. Segment statistics (segment,
// reserved_bytes, num_device_alloc) follow placement, as in PyTorch's own
// caching. Every bin of the device is drained back into the pools before
// idle segments are released (empty_cache, a memory limit, the OOM retry),
// when history recording starts, and before a large request (over 1 MiB)
// that missed its own bin chooses a block while bins hold large blocks: a
// block that another thread freed is then as much a candidate as it would
// be without the caches. A training step's peak reserved memory measured
// 1.37x PyTorch's with no drain before a large request (bins kept blocks of
// up to 128 MiB aside while other sizes mapped new segments), and 1.15x
// with a drain only before a new segment: the backward pass frees on
// another thread than the forward pass allocates, and a request that
// cannot see the block of its size splits a larger one that a later
// request needs whole (TestThreadCacheLargeMissSeesOtherThreadsBlocks).

// MaxCachedBlock is the largest block a thread cache holds (128 MiB): the
// blocks that share segments (up to midRequest, Note [How blocks are
// placed]) and the large ones a training step frees and asks for again
// (activations, gradients of a layer), whose trip through Go cost 2.6 µs
// against PyTorch's 2.1 at 64 MiB. A large block in a bin keeps its segment
// as PyTorch's cache keeps its large blocks: drained back before idle
// segments are released (empty_cache, a memory limit, the OOM retry).
const MaxCachedBlock = 128 << 20

// CacheEntry is one block in a thread cache.
type CacheEntry struct {
	Addr   uintptr
	Size   uintptr     // the block's size (a multiple of 512)
	Stream core.Stream // the block's stream: a hit must ask for this one
	// Out: handed out by a hit that the core has not synced yet; Requested
	// is the size asked then.
	Out       bool
	Requested uintptr
}

// What CachePending counts, and its pool index (all, small, large as the
// statistics).
const (
	PendingCount = iota
	PendingBytes
	PendingRequested
	NumPending
)

// CachePending is what a bin's fast path did since the core last synced it.
type CachePending struct {
	// Hits[q][p]: what the hits handed out (count, bytes, requested) in
	// pool p (0 all, 1 small, 2 large).
	Hits [NumPending][3]int64
	// Net[q][p]: hits minus undos; High[q][p]: the highest Net reached.
	Net, High [NumPending][3]int64
}

// ThreadCache is one thread's bin on one device (export implements it in C).
// Every method but Lock is called with the bin locked, and with the
// allocator's mu held.
type ThreadCache interface {
	Lock()
	Unlock()
	Len() int
	Cap() int
	Entry(i int) CacheEntry
	// Remove drops entry i, keeping the others in order.
	Remove(i int)
	// Push adds e at the top (newest); Len() < Cap().
	Push(e CacheEntry)
	// TakePending returns the pending counts and zeroes them.
	TakePending() CachePending
	// Dead says the owning thread has exited.
	Dead() bool
	// Register is called when the allocator starts to track the bin;
	// Retire when it stops (the bin is empty, and if dead, reusable).
	Register()
	Retire()
}

// cacheable says whether a block being freed (still counted allocated, with
// its requested size) may go to a thread cache.
func (a *Allocator) cacheable(b *block) bool {
	return a.hist == nil && len(b.streams) == 0 && b.seg.pools.tag.id == 0 &&
		b.size <= MaxCachedBlock && b.size == roundRequest(b.requested)
}

// lock takes mu and syncs every thread cache of the device (Note [Thread
// caches]): what every method that reads or changes state starts with.
func (a *Allocator) lock() {
	a.mu.Lock()
	if len(a.caches) > 0 {
		a.syncCachesLocked()
	}
}

// syncCachesLocked syncs every bin and adopts those of exited threads.
func (a *Allocator) syncCachesLocked() {
	kept := a.caches[:0]
	for _, tc := range a.caches {
		tc.Lock()
		a.syncCacheLocked(tc)
		if tc.Dead() {
			a.drainCacheLocked(tc)
		}
		if tc.Len() == 0 { // untracked until its next block
			tc.Retire()
		} else {
			kept = append(kept, tc)
		}
		tc.Unlock()
	}
	clear(a.caches[len(kept):])
	a.caches = kept
}

// syncCacheLocked makes the core see what tc's fast path did: its Out
// entries become allocated blocks, its counts go into the statistics.
func (a *Allocator) syncCacheLocked(tc ThreadCache) {
	p := tc.TakePending()
	hits := p.Hits[PendingCount][0]
	if hits == 0 {
		return // no hit since the last sync, so no entry is Out
	}
	for i := 0; i < tc.Len(); {
		e := tc.Entry(i)
		if !e.Out {
			i++
			continue
		}
		b := a.live.get(e.Addr)
		if b == nil || b.cachedBy != tc {
			panic(core.Errorf(core.ErrInternal, "device %d: thread cache entry %#x is not a block cached in that bin", a.device, e.Addr))
		}
		b.cachedBy = nil
		b.requested = e.Requested
		tc.Remove(i)
	}
	a.allocs += uint64(hits)
	a.frees += uint64(hits - p.Net[PendingCount][0])
	kinds := [NumPending]statKind{statAllocation, statAllocatedBytes, statRequestedBytes}
	for q, kind := range kinds {
		for pool := range 3 {
			s := &a.st.by[kind][pool]
			if s.current+p.High[q][pool] > s.peak {
				s.peak = s.current + p.High[q][pool]
			}
			s.current += p.Net[q][pool]
			s.allocated += p.Hits[q][pool]
			s.freed += p.Hits[q][pool] - p.Net[q][pool]
		}
	}
	// The bin gave out what the user holds now and took back what it undid.
	for q, kind := range [2]statKind{statThreadCache, statThreadCacheBytes} {
		for pool := range 3 {
			s := &a.st.by[kind][pool]
			s.current -= p.Net[q][pool]
			s.allocated += p.Hits[q][pool] - p.Net[q][pool]
			s.freed += p.Hits[q][pool]
		}
	}
}

// drainCacheLocked gives every block of tc (synced: none is Out) back to
// its pool.
func (a *Allocator) drainCacheLocked(tc ThreadCache) {
	for tc.Len() > 0 {
		e := tc.Entry(0)
		tc.Remove(0)
		a.uncacheLocked(e.Addr, tc)
	}
}

// drainCachesLocked syncs every bin of the device and gives all their blocks
// back to the pools (before idle segments are released).
func (a *Allocator) drainCachesLocked() {
	if len(a.caches) == 0 {
		return
	}
	for _, tc := range a.caches {
		tc.Lock()
		a.syncCacheLocked(tc)
		a.drainCacheLocked(tc)
		tc.Retire()
		tc.Unlock()
	}
	clear(a.caches)
	a.caches = a.caches[:0]
}

// uncacheLocked takes the cached block at addr out of tc's keeping and
// returns it to its pool.
func (a *Allocator) uncacheLocked(addr uintptr, tc ThreadCache) {
	b := a.live.take(addr)
	if b == nil || b.cachedBy != tc {
		panic(core.Errorf(core.ErrInternal, "device %d: thread cache entry %#x is not a block cached in that bin", a.device, addr))
	}
	b.cachedBy = nil
	a.st.add(statThreadCache, b.seg.small, -1)
	a.st.add(statThreadCacheBytes, b.seg.small, -int64(b.size))
	a.returnBlockLocked(b)
}

// cacheLocked puts b (freed for the user, its statistics counted) in tc.
func (a *Allocator) cacheLocked(b *block, tc ThreadCache) {
	tc.Lock()
	defer tc.Unlock()
	if tc.Len() >= tc.Cap() { // the oldest block makes room
		e := tc.Entry(0)
		tc.Remove(0)
		a.uncacheLocked(e.Addr, tc)
	}
	b.cachedBy = tc
	b.requested = 0
	b.ctx = 0
	a.live.put(b.addr, b)
	tc.Push(CacheEntry{Addr: b.addr, Size: b.size, Stream: b.seg.pools.stream})
	a.st.add(statThreadCache, b.seg.small, 1)
	a.st.add(statThreadCacheBytes, b.seg.small, int64(b.size))
	for _, c := range a.caches {
		if c == tc {
			return
		}
	}
	tc.Register()
	a.caches = append(a.caches, tc)
}

// DrainThreadCaches gives every block of every thread cache of the device
// back to the pools.
func (a *Allocator) DrainThreadCaches() {
	a.lock()
	defer a.mu.Unlock()
	a.drainCachesLocked()
}
