package alloc

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
)

// Validate checks every invariant written next to the allocator's data:
// blocks tile their segments, free neighbours are merged, the free sets hold
// exactly the free blocks in order, the live map holds exactly the allocated
// ones, the heap's segments are ordered, disjoint and inside their ranges, and
// the statistics agree with all of it. It returns an *Error of code
// ErrInternal that names the first broken invariant.
func (a *Allocator) Validate() error {
	a.lock()
	defer a.mu.Unlock()
	if err := a.validateLocked(); err != nil {
		return core.Errorf(core.ErrInternal, "allocator of device %d: invariant broken: %v", a.device, err)
	}
	return nil
}

func (a *Allocator) validateLocked() error {
	var (
		allocated, nAlloc, requested [numStatPools]int64
		reserved, nSeg, paused       [numStatPools]int64
		pinnedAhead                  uint64
		nSplit, splitBytes           [numStatPools]int64
		nCached, cachedBytes         [numStatPools]int64
		freeBlocks                   = map[*freeSet]int{}
	)
	// Every bin entry (none is Out: lock() synced them) names a block
	// cached in that bin; each block is in one bin at most once.
	inBin := map[uintptr]ThreadCache{}
	for i, tc := range a.caches {
		for _, o := range a.caches[:i] {
			if o == tc {
				return fmt.Errorf("a thread cache is tracked twice")
			}
		}
		tc.Lock()
		a.syncCacheLocked(tc) // its owner may have had hits since lock()
		for j := 0; j < tc.Len(); j++ {
			e := tc.Entry(j)
			if _, dup := inBin[e.Addr]; dup || e.Out {
				tc.Unlock()
				return fmt.Errorf("thread cache entry %#x is in more than one bin entry, or not synced (out %v)", e.Addr, e.Out)
			}
			inBin[e.Addr] = tc
			b := a.live.get(e.Addr)
			if b == nil || b.cachedBy != tc || b.size != e.Size || b.seg.pools.stream != e.Stream {
				tc.Unlock()
				return fmt.Errorf("thread cache entry %#x (%d bytes) is not a block cached in that bin with that size and stream", e.Addr, e.Size)
			}
		}
		tc.Unlock()
	}
	pool := func(small bool) statPool {
		if small {
			return poolSmall
		}
		return poolLarge
	}
	h := &a.heap
	for i, seg := range h.segments {
		if i > 0 {
			prev := h.segments[i-1]
			if prev.heapOff+uint64(prev.size) > seg.heapOff {
				return fmt.Errorf("segments at heap offsets %d and %d overlap or are out of order", prev.heapOff, seg.heapOff)
			}
		}
		inRange := false
		for _, r := range h.ranges {
			if seg.heapOff >= r.base && seg.heapOff+uint64(seg.size) <= r.base+uint64(r.size) {
				inRange = seg.addr-r.addr == uintptr(seg.heapOff-r.base)
			}
		}
		if !inRange {
			return fmt.Errorf("segment %d (%#x, heap offset %d) is not where its range puts it", seg.id, seg.addr, seg.heapOff)
		}
		if seg.unmapped {
			return fmt.Errorf("segment %d (%#x, heap offset %d) is unmapped but still in the heap: its blocks would fault", seg.id, seg.addr, seg.heapOff)
		}
		if a.streams[poolKey{seg.pools.tag.id, seg.pools.stream}] != seg.pools || a.tags[seg.pools.tag.id] != seg.pools.tag {
			return fmt.Errorf("segment %d belongs to pools of an unknown stream", seg.id)
		}
		set := seg.pools.pool(seg.small)
		var sum uintptr
		n := 0
		var prev *block
		for b := seg.first; b != nil; b = b.next {
			if b.seg != seg || b.prev != prev {
				return fmt.Errorf("block %#x of segment %d has broken links", b.addr, seg.id)
			}
			if b.addr != seg.addr+sum || b.heapOff != seg.heapOff+uint64(sum) {
				return fmt.Errorf("block %#x of segment %d leaves a gap or overlaps (expected %#x)", b.addr, seg.id, seg.addr+sum)
			}
			if b.size == 0 || b.size%minBlockSize != 0 {
				return fmt.Errorf("block %#x has size %d, not a positive multiple of %d", b.addr, b.size, minBlockSize)
			}
			if b.allocated {
				if a.live.get(b.addr) != b {
					return fmt.Errorf("allocated block %#x is missing from the live map", b.addr)
				}
				if set.contains(b) {
					return fmt.Errorf("allocated block %#x is in a free set", b.addr)
				}
				n++
				p := pool(seg.small)
				if b.cachedBy != nil {
					if inBin[b.addr] != b.cachedBy || b.requested != 0 || len(b.streams) != 0 || seg.pools.tag.id != 0 {
						return fmt.Errorf("cached block %#x is not in the bin that holds it, or has a request, streams or a tag", b.addr)
					}
					nCached[p]++
					cachedBytes[p] += int64(b.size)
				} else {
					allocated[p] += int64(b.size)
					requested[p] += int64(b.requested)
					nAlloc[p]++
				}
			} else {
				if prev != nil && !prev.allocated {
					return fmt.Errorf("free blocks %#x and %#x are neighbours, not merged", prev.addr, b.addr)
				}
				if !set.contains(b) {
					return fmt.Errorf("free block %#x is missing from its pool", b.addr)
				}
				freeBlocks[set]++
				if isInactiveSplit(b) {
					nSplit[pool(seg.small)]++
					splitBytes[pool(seg.small)] += int64(b.size)
				}
			}
			sum += b.size
			prev = b
		}
		if sum != seg.size {
			return fmt.Errorf("blocks of segment %d add up to %d bytes, not %d", seg.id, sum, seg.size)
		}
		if n != seg.nAllocated {
			return fmt.Errorf("segment %d counts %d allocated blocks but holds %d", seg.id, seg.nAllocated, n)
		}
		if seg.paused {
			if !seg.pools.tag.paused {
				return fmt.Errorf("segment %d is paused but its tag %q is live (untagged memory is never paused)", seg.id, seg.pools.tag.name)
			}
			paused[pool(seg.small)] += int64(seg.size)
		} else {
			reserved[pool(seg.small)] += int64(seg.size)
		}
		nSeg[pool(seg.small)]++
		if seg.backupValid && seg.backup == 0 {
			return fmt.Errorf("segment %d has a valid host copy but no host memory", seg.id)
		}
		if seg.pinnedAhead {
			pinnedAhead += uint64(seg.size)
		}
	}
	if pinnedAhead != a.pinnedAhead {
		return fmt.Errorf("segments pinned ahead add up to %d bytes, the allocator counts %d", pinnedAhead, a.pinnedAhead)
	}
	for _, sp := range a.order {
		for _, set := range []*freeSet{&sp.small, &sp.large} {
			if set.count != freeBlocks[set] {
				return fmt.Errorf("pool of stream %d holds %d blocks but its segments have %d free", sp.number, set.count, freeBlocks[set])
			}
			var last *block
			var bad error
			set.walk(func(b *block) bool {
				switch {
				case b.allocated:
					bad = fmt.Errorf("allocated block %#x is in a free set", b.addr)
				case b.seg.pools != sp || b.seg.pools.pool(b.seg.small) != set:
					bad = fmt.Errorf("free block %#x is in the wrong pool", b.addr)
				case last != nil && !lessKey(last.size, last.heapOff, b):
					bad = fmt.Errorf("free set out of order at %#x", b.addr)
				case b.left != nil && b.left.prio > b.prio, b.right != nil && b.right.prio > b.prio:
					bad = fmt.Errorf("free set heap order broken at %#x", b.addr)
				}
				last = b
				return bad == nil
			})
			if bad != nil {
				return bad
			}
		}
	}
	if a.live.len() != int(nAlloc[poolSmall]+nAlloc[poolLarge]+nCached[poolSmall]+nCached[poolLarge]) {
		return fmt.Errorf("live map has %d entries for %d allocated and %d cached blocks", a.live.len(), nAlloc[poolSmall]+nAlloc[poolLarge], nCached[poolSmall]+nCached[poolLarge])
	}
	if len(inBin) != int(nCached[poolSmall]+nCached[poolLarge]) {
		return fmt.Errorf("thread caches hold %d entries for %d cached blocks", len(inBin), nCached[poolSmall]+nCached[poolLarge])
	}
	for _, p := range []statPool{poolSmall, poolLarge} {
		allocated[poolAll] += allocated[p]
		requested[poolAll] += requested[p]
		nAlloc[poolAll] += nAlloc[p]
		reserved[poolAll] += reserved[p]
		paused[poolAll] += paused[p]
		nSeg[poolAll] += nSeg[p]
		nSplit[poolAll] += nSplit[p]
		splitBytes[poolAll] += splitBytes[p]
		nCached[poolAll] += nCached[p]
		cachedBytes[poolAll] += cachedBytes[p]
	}
	for p := statPool(0); p < numStatPools; p++ {
		checks := []struct {
			kind statKind
			want int64
		}{
			{statAllocation, nAlloc[p]}, {statAllocatedBytes, allocated[p]},
			{statRequestedBytes, requested[p]}, {statSegment, nSeg[p]},
			{statReservedBytes, reserved[p]}, {statPausedBytes, paused[p]},
			{statInactiveSplit, nSplit[p]}, {statInactiveSplitBytes, splitBytes[p]},
			{statThreadCache, nCached[p]}, {statThreadCacheBytes, cachedBytes[p]},
		}
		for _, c := range checks {
			s := a.st.by[c.kind][p]
			if s.current != c.want || s.current != s.allocated-s.freed || s.peak < s.current {
				return fmt.Errorf("statistic %s.%s: current %d, allocated %d, freed %d, peak %d; the blocks say %d",
					statKindNames[c.kind], statPoolNames[p], s.current, s.allocated, s.freed, s.peak, c.want)
			}
		}
	}
	return nil
}
