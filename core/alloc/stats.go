package alloc

// Statistics, named as torch.cuda.memory_stats names them so that tools and
// users who know PyTorch's allocator read ours without a dictionary.

// statKind is one family of statistics (allocation counts, bytes, ...).
type statKind int

const (
	statAllocation     statKind = iota // allocated blocks (count)
	statSegment                        // segments (count)
	statActive                         // active blocks (count): derived, = allocation
	statAllocatedBytes                 // bytes of allocated blocks (rounded sizes)
	statReservedBytes                  // bytes of segments
	statActiveBytes                    // bytes of active blocks: derived, = allocated_bytes
	statRequestedBytes                 // bytes asked for by callers
	// statInactiveSplit counts free blocks of segments that are split (the
	// segment has other blocks too), which empty_cache cannot release:
	// PyTorch's inactive_split, a measure of fragmentation; a block is
	// counted while isInactiveSplit(b). statInactiveSplitBytes is their size.
	statInactiveSplit
	statInactiveSplitBytes
	statPausedBytes // bytes of segments whose memory Pause released
	// statThreadCache counts blocks that the user freed and a thread cache
	// keeps (Note [Thread caches]); statThreadCacheBytes is their size.
	// Not PyTorch's: reported after every key of the first versions.
	statThreadCache
	statThreadCacheBytes
	numStatKinds
)

var statKindNames = [numStatKinds]string{
	"allocation", "segment", "active", "allocated_bytes", "reserved_bytes",
	"active_bytes", "requested_bytes", "inactive_split", "inactive_split_bytes", "paused_bytes",
	"thread_cache", "thread_cache_bytes",
}

// statPool selects the aggregate ("all") or one of the two pools.
type statPool int

const (
	poolAll statPool = iota
	poolSmall
	poolLarge
	numStatPools
)

var statPoolNames = [numStatPools]string{"all", "small_pool", "large_pool"}

// stat is one counter.
// Invariant: current == allocated - freed, peak >= current, all >= 0.
type stat struct {
	current, peak, allocated, freed int64
}

func (s *stat) add(n int64) {
	s.current += n
	if n > 0 {
		s.allocated += n
		if s.current > s.peak {
			s.peak = s.current
		}
	} else {
		s.freed -= n
	}
}

// stats is the allocator's set of counters, guarded by the allocator's lock.
type stats struct {
	by             [numStatKinds][numStatPools]stat
	numAllocRetry  int64 // allocations that freed cached segments and tried again
	numOOM         int64 // allocations that failed for lack of memory
	numDeviceAlloc int64 // segments created from the backend
	numDeviceFree  int64 // segments released to the backend
	numSyncAll     int64 // device-wide synchronisations before releasing memory
}

// add changes kind by n in the aggregate and in the pool of the block.
func (s *stats) add(kind statKind, small bool, n int64) {
	s.by[kind][poolAll].add(n)
	if small {
		s.by[kind][poolSmall].add(n)
	} else {
		s.by[kind][poolLarge].add(n)
	}
}

// block counts one block allocated (sign 1) or freed (sign -1): the hot
// path's three updates, with the pool picked once.
func (s *stats) block(small bool, sign, size, requested int64) {
	p := poolLarge
	if small {
		p = poolSmall
	}
	s.by[statAllocation][poolAll].add(sign)
	s.by[statAllocation][p].add(sign)
	s.by[statAllocatedBytes][poolAll].add(sign * size)
	s.by[statAllocatedBytes][p].add(sign * size)
	s.by[statRequestedBytes][poolAll].add(sign * requested)
	s.by[statRequestedBytes][p].add(sign * requested)
}

func (s *stats) resetPeaks() {
	for k := range s.by {
		for p := range s.by[k] {
			s.by[k][p].peak = s.by[k][p].current
		}
	}
}

// Stat is one named statistic.
type Stat struct {
	Key   string
	Value int64
}

// StatKeys lists every statistic's key in the order Stats returns them.
// Keys are only ever added at the end (symmem.h), so the kinds added later
// (inactive_split*) come after the counters of the first version.
var StatKeys = func() []string {
	var keys []string
	kinds := func(from, to statKind) {
		for k := from; k < to; k++ {
			for p := statPool(0); p < numStatPools; p++ {
				base := statKindNames[k] + "." + statPoolNames[p] + "."
				keys = append(keys, base+"current", base+"peak", base+"allocated", base+"freed")
			}
		}
	}
	kinds(0, statInactiveSplit)
	keys = append(keys, "num_alloc_retries", "num_ooms", "num_device_alloc",
		"num_device_free", "num_sync_all_streams", "memory_limit")
	kinds(statInactiveSplit, statThreadCache)
	for _, k := range []string{"oversize_allocations", "oversize_segments"} {
		keys = append(keys, k+".current", k+".peak", k+".allocated", k+".freed")
	}
	keys = append(keys, "max_split_size")
	kinds(statThreadCache, numStatKinds)
	return keys
}()

// Note [Statistics that cannot apply]
//
// oversize_allocations, oversize_segments and max_split_size are PyTorch's
// counts of blocks at or above max_split_size (PYTORCH_CUDA_ALLOC_CONF),
// which are never split. libsymmem has no such limit (its blocks are split by
// the rules of Note [How blocks are placed], the same for every rank), which
// is PyTorch's default too: max_split_size is -1 ("none", as torch reports
// SIZE_MAX) and the oversize counts are 0, as in PyTorch without the option.

// values lists the statistics in StatKeys order.
func (s *stats) values(limit uint64) []int64 {
	v := make([]int64, 0, len(StatKeys))
	// Every block that is allocated is active here (no block waits on
	// events), so the active statistics are the allocated ones, not kept twice.
	by := s.by
	by[statActive] = by[statAllocation]
	by[statActiveBytes] = by[statAllocatedBytes]
	kinds := func(from, to statKind) {
		for k := from; k < to; k++ {
			for p := range by[k] {
				st := by[k][p]
				v = append(v, st.current, st.peak, st.allocated, st.freed)
			}
		}
	}
	kinds(0, statInactiveSplit)
	v = append(v, s.numAllocRetry, s.numOOM, s.numDeviceAlloc, s.numDeviceFree,
		s.numSyncAll, int64(limit))
	kinds(statInactiveSplit, statThreadCache)
	v = append(v, 0, 0, 0, 0, 0, 0, 0, 0) // oversize_*: see the Note above
	v = append(v, -1)                     // max_split_size: no limit
	kinds(statThreadCache, numStatKinds)
	return v
}

// isInactiveSplit says whether b counts in inactive_split: free, in a
// segment it does not fill alone.
func isInactiveSplit(b *block) bool {
	return !b.allocated && (b.prev != nil || b.next != nil)
}

// inactiveSplit adds b's contribution to inactive_split (sign 1) or takes
// it away (sign -1).
func (s *stats) inactiveSplit(b *block, sign int64) {
	if isInactiveSplit(b) {
		s.add(statInactiveSplit, b.seg.small, sign)
		s.add(statInactiveSplitBytes, b.seg.small, sign*int64(b.size))
	}
}
