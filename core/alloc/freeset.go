package alloc

// freeSet is a pool's index of free blocks, ordered by (size, heap offset):
// the first block not less than (n, 0) is the best fit for n bytes, and ties
// go to the lowest offset. It is an intrusive treap: the tree links live in
// the blocks themselves, so inserting and removing allocate nothing.
//
// Invariants (checked by Allocator.Validate):
//   - in-order traversal is strictly increasing in (size, heapOffset);
//   - every node's prio is >= its children's (a max-heap on prio);
//   - prio is a hash of the block's heap offset, so the tree's shape, like
//     everything else about placement, depends only on the call sequence.
type freeSet struct {
	root  *block
	count int
}

func lessKey(size uintptr, off uint64, b *block) bool {
	return size < b.size || (size == b.size && off < b.heapOff)
}

func prioOf(off uint64) uint32 {
	x := off*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
	x ^= x >> 29
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 32
	return uint32(x)
}

// split divides t into blocks with key < (size, off) and the rest.
func split(t *block, size uintptr, off uint64) (l, r *block) {
	if t == nil {
		return nil, nil
	}
	if lessKey(size, off, t) || (size == t.size && off == t.heapOff) {
		l, t.left = split(t.left, size, off)
		return l, t
	}
	t.right, r = split(t.right, size, off)
	return t, r
}

// merge joins l and r, where every key of l is less than every key of r.
func merge(l, r *block) *block {
	switch {
	case l == nil:
		return r
	case r == nil:
		return l
	case l.prio >= r.prio:
		l.right = merge(l.right, r)
		return l
	default:
		r.left = merge(l, r.left)
		return r
	}
}

func (s *freeSet) insert(b *block) {
	b.prio = prioOf(b.heapOff)
	b.left, b.right = nil, nil
	s.root = insertNode(s.root, b)
	s.count++
}

func insertNode(t, b *block) *block {
	if t == nil {
		return b
	}
	if b.prio > t.prio {
		b.left, b.right = split(t, b.size, b.heapOff)
		return b
	}
	if lessKey(b.size, b.heapOff, t) {
		t.left = insertNode(t.left, b)
	} else {
		t.right = insertNode(t.right, b)
	}
	return t
}

// remove takes b out of the set; b must be in it.
func (s *freeSet) remove(b *block) {
	link := &s.root
	for *link != b {
		if *link == nil {
			panic("symmem: freeSet.remove of a block that is not in the set")
		}
		if lessKey(b.size, b.heapOff, *link) {
			link = &(*link).left
		} else {
			link = &(*link).right
		}
	}
	*link = merge(b.left, b.right)
	b.left, b.right = nil, nil
	s.count--
}

// lowerBound returns the smallest block of at least size bytes (lowest heap
// offset among equals), or nil.
func (s *freeSet) lowerBound(size uintptr) *block {
	var best *block
	for t := s.root; t != nil; {
		if t.size >= size {
			best = t
			t = t.left
		} else {
			t = t.right
		}
	}
	return best
}

// contains reports whether b is a node of the set (validator only).
func (s *freeSet) contains(b *block) bool {
	for t := s.root; t != nil; {
		if t == b {
			return true
		}
		if lessKey(b.size, b.heapOff, t) {
			t = t.left
		} else {
			t = t.right
		}
	}
	return false
}

// walk calls fn for each block in order; it stops when fn returns false.
func (s *freeSet) walk(fn func(*block) bool) {
	var rec func(t *block) bool
	rec = func(t *block) bool {
		if t == nil {
			return true
		}
		return rec(t.left) && fn(t) && rec(t.right)
	}
	rec(s.root)
}
