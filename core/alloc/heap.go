package alloc

import (
	"sort"

	"github.com/libsymmem/libsymmem/core"
)

// heap is a device's address space for segments: one or more reserved
// ranges, addressed by a heap offset that runs on from one range to the next
// (range i starts at offset base[i] = the sizes of ranges 0..i-1 added up).
// Segments are mapped at the lowest offset where they fit, so the offset of a
// segment, like the rest of placement, is a function of the call sequence
// alone, and peers that made the same calls hold it at the same offset.
//
// Invariants (Validate checks them):
//   - segments is sorted by heapOff and no two overlap;
//   - every segment lies inside one range, and
//     seg.addr - r.addr == seg.heapOff - r.base for that range r.
type heap struct {
	be       core.Backend
	device   int
	gran     uintptr
	rangeLen uintptr // size of each reserved range (a larger segment gets its own)
	ranges   []heapRange
	segments []*segment
}

type heapRange struct {
	addr uintptr
	size uintptr
	base uint64
}

// defaultRangeLen is twice the device's memory (at least 4 GiB), so that a
// single range normally holds everything; SYMMEM_HEAP_RESERVE overrides it.
func defaultRangeLen(gran uintptr, total uint64) uintptr {
	n := core.Current().Size("SYMMEM_HEAP_RESERVE", 2*total)
	if n < 4<<30 {
		n = 4 << 30
	}
	return roundUp(uintptr(n), gran)
}

func (h *heap) init(be core.Backend, device int, gran uintptr, total uint64) {
	h.be, h.device, h.gran = be, device, gran
	h.rangeLen = defaultRangeLen(gran, total)
}

// place finds the lowest heap offset where size bytes fit, reserving a new
// range when none does. It does not record the segment (see add).
func (h *heap) place(size uintptr) (addr uintptr, off uint64, err error) {
	i := 0 // index into segments, which are sorted by offset, as ranges are
	for _, r := range h.ranges {
		cursor := r.base
		end := r.base + uint64(r.size)
		for ; i < len(h.segments) && h.segments[i].heapOff < end; i++ {
			s := h.segments[i]
			if s.heapOff-cursor >= uint64(size) {
				return r.addr + uintptr(cursor-r.base), cursor, nil
			}
			cursor = s.heapOff + uint64(s.size)
		}
		if end-cursor >= uint64(size) {
			return r.addr + uintptr(cursor-r.base), cursor, nil
		}
	}
	n := h.rangeLen
	if size > n {
		n = roundUp(size, h.gran)
	}
	a, err := h.be.Reserve(h.device, n)
	if err != nil {
		return 0, 0, err
	}
	var base uint64
	if k := len(h.ranges); k > 0 {
		base = h.ranges[k-1].base + uint64(h.ranges[k-1].size)
	}
	h.ranges = append(h.ranges, heapRange{addr: a, size: n, base: base})
	return a, base, nil
}

// add records seg, which place positioned.
func (h *heap) add(seg *segment) {
	i := sort.Search(len(h.segments), func(i int) bool { return h.segments[i].heapOff > seg.heapOff })
	h.segments = append(h.segments, nil)
	copy(h.segments[i+1:], h.segments[i:])
	h.segments[i] = seg
}

// remove forgets the segment at heap offset off.
func (h *heap) remove(off uint64) {
	i := sort.Search(len(h.segments), func(i int) bool { return h.segments[i].heapOff >= off })
	if i < len(h.segments) && h.segments[i].heapOff == off {
		h.segments = append(h.segments[:i], h.segments[i+1:]...)
	}
}

// segmentAt returns the segment whose mapping holds addr, or nil.
func (h *heap) segmentAt(addr uintptr) *segment {
	for _, r := range h.ranges {
		if addr < r.addr || addr >= r.addr+r.size {
			continue
		}
		off := r.base + uint64(addr-r.addr)
		i := sort.Search(len(h.segments), func(i int) bool { return h.segments[i].heapOff > off })
		if i == 0 {
			return nil
		}
		s := h.segments[i-1]
		if off < s.heapOff+uint64(s.size) {
			return s
		}
		return nil
	}
	return nil
}

// close gives back every reserved range; no segment may be mapped.
func (h *heap) close() error {
	var first error
	for _, r := range h.ranges {
		if err := h.be.Unreserve(h.device, r.addr, r.size); err != nil && first == nil {
			first = err
		}
	}
	h.ranges = nil
	return first
}
