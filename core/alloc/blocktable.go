package alloc

// blockTable maps the address of every allocated block to the block: an
// open-addressing hash table with linear probing, sized to stay at most half
// full. It exists because free() must find a block from its pointer on the
// hot path, and a table specialised for 512-byte-aligned addresses costs a
// fraction of a general map's insert and delete.
//
// Invariants: len(slots) is a power of two and >= 2*n; every key is nonzero
// (0 marks an empty slot); a key sits in the first empty-free run of slots
// starting at its hash (no tombstones: deletion shifts entries back).
type blockTable struct {
	slots []tableSlot
	n     int
	shift uint
}

type tableSlot struct {
	addr uintptr
	b    *block
}

func (t *blockTable) home(addr uintptr) uintptr {
	return uintptr((uint64(addr>>9) * 0x9E3779B97F4A7C15) >> t.shift)
}

func (t *blockTable) get(addr uintptr) *block {
	if t.n == 0 || addr == 0 {
		return nil
	}
	mask := uintptr(len(t.slots) - 1)
	for i := t.home(addr); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.addr == addr {
			return s.b
		}
		if s.addr == 0 {
			return nil
		}
	}
}

func (t *blockTable) put(addr uintptr, b *block) {
	if 2*(t.n+1) > len(t.slots) {
		t.grow()
	}
	mask := uintptr(len(t.slots) - 1)
	for i := t.home(addr); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.addr == 0 || s.addr == addr {
			if s.addr == 0 {
				t.n++
			}
			s.addr, s.b = addr, b
			return
		}
	}
}

func (t *blockTable) grow() {
	old := t.slots
	size := 64
	if len(old) > 0 {
		size = 2 * len(old)
	}
	t.slots = make([]tableSlot, size)
	t.shift = uint(64 - log2(size))
	t.n = 0
	for _, s := range old {
		if s.addr != 0 {
			t.put(s.addr, s.b)
		}
	}
}

func log2(n int) int {
	k := 0
	for 1<<k < n {
		k++
	}
	return k
}

func (t *blockTable) delete(addr uintptr) { t.take(addr) }

// take removes addr and returns its block, or nil if addr is not there.
func (t *blockTable) take(addr uintptr) *block {
	if t.n == 0 || addr == 0 {
		return nil
	}
	mask := uintptr(len(t.slots) - 1)
	i := t.home(addr)
	for t.slots[i].addr != addr {
		if t.slots[i].addr == 0 {
			return nil
		}
		i = (i + 1) & mask
	}
	b := t.slots[i].b
	// Shift later entries of the run back into the hole when their home
	// position allows it, so that lookups never meet a false empty slot.
	for j := (i + 1) & mask; t.slots[j].addr != 0; j = (j + 1) & mask {
		h := t.home(t.slots[j].addr)
		if (j-h)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = tableSlot{}
	t.n--
	return b
}

func (t *blockTable) len() int { return t.n }
