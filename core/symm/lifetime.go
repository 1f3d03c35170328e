package symm

import (
	"sync"
	"sync/atomic"
	"time"
)

// Note [Calls in flight]
//
// C may release a handle while another thread is inside a call on it (a
// wait_signal blocked for a peer, a barrier, a put). Unmapping the signal
// pads under that call would make it fault, so a handle counts the calls
// that touch its memory: each enters before it reads or writes a pad and
// leaves when done. Release first marks the handle closing (every later
// call fails with ErrInvalidState, and a host-side wait in progress sees
// the closing channel and gives up at once with ErrInvalidState, naming the
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
// them. The zero value is not usable: see init.
type lifetime struct {
	// state is the number of calls in flight, plus closedBit once release
	// has begun.
	state   atomic.Int64
	closing chan struct{} // closed when release begins
	idle    chan struct{} // closed once release has begun and no call is in flight
	once    sync.Once
}

const closedBit = int64(1) << 62

func newLifetime() *lifetime {
	l := &lifetime{}
	l.init()
	return l
}

// init makes the zero value usable (for a lifetime held by value).
func (l *lifetime) init() {
	l.closing, l.idle = make(chan struct{}), make(chan struct{})
}

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
func (l *lifetime) leave() {
	if l.state.Add(-1) == closedBit {
		l.once.Do(func() { close(l.idle) })
	}
}

// close begins the release: later enters fail and waits in progress are
// told to give up. It returns false if release had already begun.
func (l *lifetime) close() bool {
	old := l.state.Or(closedBit)
	if old&closedBit != 0 {
		return false
	}
	close(l.closing)
	if old == 0 {
		l.once.Do(func() { close(l.idle) })
	}
	return true
}

// closed says whether release has begun.
func (l *lifetime) closed() bool { return l.state.Load()&closedBit != 0 }

// drain waits up to bound for the calls in flight to leave; it returns the
// number still in flight (0: none).
func (l *lifetime) drain(bound time.Duration) int64 {
	select {
	case <-l.idle: // the usual case: no call in flight, no timer to make
		return 0
	default:
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-l.idle:
		return 0
	case <-t.C:
		return l.state.Load() &^ closedBit
	}
}
