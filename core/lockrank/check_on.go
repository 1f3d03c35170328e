//go:build symmem_lockrank

package lockrank

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
)

// Checking is whether this build checks the lock order.
const Checking = true

// held is what each goroutine holds of the ranked locks, by goroutine ID,
// in the order it took them.
var held = struct {
	sync.Mutex
	by map[uint64][]heldLock
}{by: map[uint64][]heldLock{}}

type heldLock struct {
	lock any
	rank int
	name string
}

// goroutineID reads the calling goroutine's number from its stack header
// ("goroutine 42 [running]:").
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		panic("lockrank: cannot read the goroutine's number from " + string(buf[:]))
	}
	return id
}

// acquire checks that the goroutine holds no lock of rank r or later, and
// then counts l as held (before the lock is taken: a wrong order fails here
// rather than deadlocking).
func acquire(l any, r Rank) {
	rank, name := r.rank()
	id := goroutineID()
	held.Lock()
	defer held.Unlock()
	for _, h := range held.by[id] {
		if h.rank >= rank {
			panic(fmt.Sprintf("lock order (Note [Lock order] in core/lockrank): taking a %s lock (rank %d) while holding a %s lock (rank %d)", name, rank, h.name, h.rank))
		}
	}
	held.by[id] = append(held.by[id], heldLock{l, rank, name})
}

// release forgets l: the calling goroutine's, or another's (a lock may be
// unlocked by a goroutine other than the one that took it).
func release(l any) {
	id := goroutineID()
	held.Lock()
	defer held.Unlock()
	if drop(id, l) {
		return
	}
	for other := range held.by {
		if drop(other, l) {
			return
		}
	}
	panic("lockrank: unlocking a lock that no goroutine holds")
}

// drop removes l from goroutine id's locks (held locked).
func drop(id uint64, l any) bool {
	hs := held.by[id]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].lock == l {
			hs = append(hs[:i], hs[i+1:]...)
			if len(hs) == 0 {
				delete(held.by, id)
			} else {
				held.by[id] = hs
			}
			return true
		}
	}
	return false
}
