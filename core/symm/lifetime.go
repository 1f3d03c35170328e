package symm

import (
	"sync/atomic"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Calls in flight]
//
// C may release a handle while another thread is inside a call on it (a
// wait_signal blocked for a peer, a barrier, a put). Unmapping the signal
// pads under that call would make it fault, so a handle counts the calls
// that touch its memory: each enters before it reads or writes a pad and
// leaves when done. Release first marks the handle closing (every later
// call fails with ErrInvalidState, and a host-side wait in progress, which
// polls the mark, gives up at once with ErrInvalidState, naming the
// release), then waits for the calls in flight to leave, bounded by the
// group's timeout; only then is memory unmapped. If calls are still in
// flight after the bound (a driver call that does not return), nothing is
// unmapped: the memory is deliberately leaked and the error says so.
//
// A group is cancelled the same way: Destroy first shuts the channel's
// sockets down (ipc.Channel.Cancel), which makes a rendezvous in flight on
// another thread fail at once instead of waiting out its timeout, then
// takes the collective lock that the rendezvous releases on its way out.

// lifetime counts an object's calls in flight and lets its release wait for
// them. The zero value is ready to use, and holds no channel or timer: a
// handle is made and released on every rendezvous, and what is checked
// often (closed) is one atomic load.
type lifetime struct {
	// state is the number of calls in flight, plus closedBit once release
	// has begun.
	state atomic.Int64
}

const closedBit = int64(1) << 62

// enter registers a call; false means release has begun (the call must
// fail without touching the object's memory).
func (l *lifetime) enter() bool {
	if l.state.Add(1)&closedBit != 0 {
		l.leave()
		return false
	}
	return true
}

// leave ends a call that enter admitted (or undoes a refused enter).
func (l *lifetime) leave() { l.state.Add(-1) }

// close begins the release: later enters fail and waits in progress,
// which poll closed, give up. It returns false if release had already
// begun.
func (l *lifetime) close() bool { return l.state.Or(closedBit)&closedBit == 0 }

// closed says whether release has begun.
func (l *lifetime) closed() bool { return l.state.Load()&closedBit != 0 }

// drain waits up to bound for the calls in flight to leave; it returns the
// number still in flight (0: none). Waits in flight poll closed and leave
// within their own polling interval, so drain polls too, with naps that
// grow to a millisecond.
func (l *lifetime) drain(bound time.Duration) int64 {
	n := l.state.Load() &^ closedBit
	if n == 0 {
		return 0
	}
	deadline := time.Now().Add(bound)
	for nap := time.Microsecond; ; nap = min(2*nap, time.Millisecond) {
		left := time.Until(deadline)
		if left <= 0 {
			return n
		}
		core.Nap(min(nap, left))
		if n = l.state.Load() &^ closedBit; n == 0 {
			return 0
		}
	}
}
