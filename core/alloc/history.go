package alloc

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Heap snapshots and allocation history]
//
// Snapshot lists every segment of a device with its blocks (address, size,
// size asked for, allocated or free), and, while recording is on
// (SetHistory), a ring of the last events: alloc, free_requested,
// free_completed, segment_alloc, segment_free, with the time and the stream.
// These are the fields of PyTorch's memory snapshots
// (torch.cuda.memory._snapshot()), which symmem.torch.memory_snapshot builds
// from them, so that PyTorch's memory visualiser draws libsymmem's heap.
//
// Call stacks come from the caller: after an allocation, the export layer
// asks a hook (symmem_set_context_hook; Python's records its stack) for a
// context number and attaches it to the block and its alloc event
// (AttachContext); a snapshot carries the numbers, the hook's owner the
// stacks. Recording is off by default and costs nothing then (one nil test).

// HistoryEvent is one entry of the allocation history.
type HistoryEvent struct {
	Action  string // alloc, free_requested, free_completed, segment_alloc, segment_free
	Addr    uintptr
	Size    uintptr // requested bytes for blocks, the whole size for segments
	Stream  core.Stream
	TimeUs  int64  // microseconds since the Unix epoch
	Context uint64 // the context hook's number (0: none)
}

// history is a ring of the last max events. Guarded by the allocator's lock.
// Invariant: len(ring) <= max; when len(ring) == max, next is the oldest.
type history struct {
	max  int
	ring []HistoryEvent
	next int
}

func (h *history) add(e HistoryEvent) {
	e.TimeUs = time.Now().UnixMicro()
	if len(h.ring) < h.max {
		h.ring = append(h.ring, e)
		return
	}
	h.ring[h.next] = e
	h.next = (h.next + 1) % h.max
}

// events returns the ring oldest first.
func (h *history) events() []HistoryEvent {
	out := make([]HistoryEvent, 0, len(h.ring))
	out = append(out, h.ring[h.next:]...)
	return append(out, h.ring[:h.next]...)
}

// historyMax is the ring size new allocators start with (0: not recording).
var historyMax atomic.Int64

// SetHistory turns recording on (max > 0 events kept, the history cleared)
// or off (max 0) for every allocator of the runtime and those made later.
func (r *Runtime) SetHistory(max int) {
	historyMax.Store(int64(max))
	for _, a := range r.Allocators() {
		a.SetHistory(max)
	}
}

// SetHistory turns this allocator's recording on (max > 0) or off.
func (a *Allocator) SetHistory(max int) {
	a.lock()
	defer a.mu.Unlock()
	if max <= 0 {
		a.hist = nil
		return
	}
	a.drainCachesLocked() // every allocation from now on is recorded
	a.hist = &history{max: max}
}

// Recording says whether the allocator records its history.
func (a *Allocator) Recording() bool {
	a.lock()
	defer a.mu.Unlock()
	return a.hist != nil
}

// record adds an event when recording is on.
func (a *Allocator) record(action string, addr, size uintptr, s core.Stream) {
	if a.hist != nil {
		a.hist.add(HistoryEvent{Action: action, Addr: addr, Size: size, Stream: s})
	}
}

// AttachContext gives the allocated block at ptr, and its latest alloc
// event, the context number ctx.
func (a *Allocator) AttachContext(ptr uintptr, ctx uint64) {
	a.lock()
	defer a.mu.Unlock()
	if b := a.live.get(ptr); b != nil {
		b.ctx = ctx
	}
	if a.hist != nil {
		for i := len(a.hist.ring) - 1; i >= 0; i-- {
			j := (a.hist.next + i) % len(a.hist.ring)
			if e := &a.hist.ring[j]; e.Action == "alloc" && e.Addr == ptr {
				e.Context = ctx
				break
			}
		}
	}
}

// BlockSnapshot is one block of a segment.
type BlockSnapshot struct {
	Addr      uintptr
	Size      uintptr
	Requested uintptr
	Allocated bool
	// ThreadCached: freed for the user, kept in a thread cache (Note
	// [Thread caches]); not Allocated.
	ThreadCached bool
	Context      uint64
}

// SegmentSnapshot is one segment and its blocks, in address order.
type SegmentSnapshot struct {
	Device    int
	Addr      uintptr
	Size      uintptr
	Stream    core.Stream
	Small     bool
	Allocated uintptr // bytes of allocated blocks
	Requested uintptr // bytes asked for by their callers
	Blocks    []BlockSnapshot
}

// Snapshot lists the allocator's segments (by address) and its history.
func (a *Allocator) Snapshot() ([]SegmentSnapshot, []HistoryEvent) {
	a.lock()
	defer a.mu.Unlock()
	segs := make([]SegmentSnapshot, 0, len(a.heap.segments))
	for _, seg := range a.heap.segments {
		s := SegmentSnapshot{Device: a.device, Addr: seg.addr, Size: seg.size, Stream: seg.pools.stream, Small: seg.small}
		for b := seg.first; b != nil; b = b.next {
			s.Blocks = append(s.Blocks, BlockSnapshot{Addr: b.addr, Size: b.size, Requested: b.requested, Allocated: b.allocated && b.cachedBy == nil, ThreadCached: b.cachedBy != nil, Context: b.ctx})
			if b.allocated && b.cachedBy == nil {
				s.Allocated += b.size
				s.Requested += b.requested
			}
		}
		segs = append(segs, s)
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].Addr < segs[j].Addr })
	var ev []HistoryEvent
	if a.hist != nil {
		ev = a.hist.events()
	}
	return segs, ev
}

// HistoryOn says whether recording was turned on (SetHistory with max > 0).
func HistoryOn() bool { return historyMax.Load() > 0 }
