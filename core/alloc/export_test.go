package alloc

// BlockTableForTest exposes blockTable to the external tests, with an int
// payload (stored in block.size) so that values can be checked.
type BlockTableForTest struct{ t blockTable }

func (x *BlockTableForTest) Put(addr uintptr, v int) { x.t.put(addr, &block{size: uintptr(v)}) }
func (x *BlockTableForTest) Delete(addr uintptr)     { x.t.delete(addr) }
func (x *BlockTableForTest) Len() int                { return x.t.len() }
func (x *BlockTableForTest) Get(addr uintptr) (int, bool) {
	b := x.t.get(addr)
	if b == nil {
		return 0, false
	}
	return int(b.size), true
}

// MarkFirstSegmentUnmappedForTest puts the allocator in the state that
// Validate must catch: a segment whose mapping is gone, still in the heap.
func (a *Allocator) MarkFirstSegmentUnmappedForTest() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.heap.segments[0].unmapped = true
}

// PinsPendingForTest is the number of pinnings ahead not yet finished.
func PinsPendingForTest() int64 { return pinsPending.Load() }
