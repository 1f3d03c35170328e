package symm

import (
	"sync"
	"sync/atomic"

	"github.com/libsymmem/libsymmem/core/lockrank"
)

// abortState is a group's abort (Note [Abort]); shared by its handles.
type abortState struct {
	set  atomic.Bool
	ch   chan struct{} // closed when set
	once sync.Once
	why  string // written before set
	// mu guards region, this rank's pad while the group has one.
	mu     lockrank.Mutex[lockrank.Abort]
	region *pads
}

func newAbortState() *abortState { return &abortState{ch: make(chan struct{})} }

// mark sets the abort; true for the call that did.
func (a *abortState) mark(why string) bool {
	first := false
	a.once.Do(func() {
		a.why = why
		a.set.Store(true)
		close(a.ch)
		first = true
	})
	return first
}

func (a *abortState) aborted() bool { return a.set.Load() }

// setRegion publishes (or, nil, withdraws) this rank's pad for Abort's
// writes; withdrawing waits for a write in progress.
func (a *abortState) setRegion(p *pads) {
	a.mu.Lock()
	a.region = p
	a.mu.Unlock()
}
