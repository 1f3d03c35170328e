package coll

import (
	"sync"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/lockrank"
)

// Port is what a collective needs of a rendezvous's handle besides its
// description (core/symm's Handle implements it): the handle's admission,
// the ends of its waits and the group's staging memory, which change while
// the handle lives. The collectives know groups and handles through the
// description and this interface only, so that membership, rendezvous and
// mapping know nothing of collectives.
type Port interface {
	// Symmetric is the handle's description, fixed when its rendezvous
	// completed: a collective copies it once, at its start.
	Symmetric() core.SymmetricBuffer
	// Enter admits a collective on the handle, or says why not (the
	// handle is released, the group aborted, or the group's collectives
	// stopped after a failure: Note [Failed collectives]); the caller
	// calls leave when the call is done with the memory. Every collective
	// enters through it.
	Enter() (leave func(), err error)
	// CollectivesStopped is the error of a collective on a group whose
	// collectives stopped (Note [Failed collectives]), or nil: what Enter
	// checks, for waits that a peer's giving up ends.
	CollectivesStopped() error
	// WaitCut says why a host-side wait that began at interrupt mark mark
	// must end now, or nil: the handle was released meanwhile (Note
	// [Calls in flight] in core/symm), the group was aborted (Note
	// [Abort]), or a signal came (Note [Interrupts] in core; the group is
	// then aborted). what names the wait: "collective's barrier (device
	// set 3)".
	WaitCut(mark uint64, what string) error
	// PeerExited is the error of a wait for group rank r whose process
	// has exited, or nil while it lives; it asks the system at most every
	// liveness interval (checked is when it last did; Note [Dead peers]
	// in core/ipc). what names the wait that was cut.
	PeerExited(r int, now time.Time, checked *time.Time, what string) error
	// Staging lends the group's staging buffers, n bytes or more each of
	// device memory (dev) and of host memory (host), to a call that uses
	// them on its stream and waits for that use before done; done ends
	// the loan, and with an error retires the buffers (a wait for the GPU
	// timed out: it may still write them). Only a group that spans
	// machines over a communicator has them.
	Staging(n uintptr) (dev, host uintptr, done func(broken error), err error)
}

// target is the handle a collective runs on: its description, copied once
// at the call's start, and its port.
type target struct {
	core.SymmetricBuffer
	port Port
}

// team is this rank's team on a group that spans machines (Note [Local
// teams] in core/symm); nil on a group of one machine.
func (h *target) team() []int {
	if h.Span == nil {
		return nil
	}
	return h.Span.Team
}

// engine is the group's communicator between machines (nil: none).
func (h *target) engine() core.Communicator {
	if h.Span == nil {
		return nil
	}
	return h.Span.Engine
}

// Note [Collective state]
//
// What only the collectives keep of a group lives here, in the group's
// core.Attachment, made by the group's first collective that needs it and
// closed when the group is destroyed: the host reference runner's channel
// locks, and the group's communicator split by local rank (Note
// [Hierarchical all-reduce]). Handles outlive their group's destruction,
// so the state does too; a split asked for after the destruction is
// refused.

// groupState is the collectives' state of one group (Note [Collective
// state]).
type groupState struct {
	// channels serialises the host reference runner's calls on one
	// collective channel of the group (each channel's device sets take
	// one barrier at a time).
	channels [core.CollChannels]lockrank.Mutex[lockrank.CollectiveChannel]
	// split is the group's communicator split by local rank.
	split splitComm
}

func newGroupState(closed bool) core.Closer {
	s := &groupState{}
	s.split.closed = closed
	return s
}

// Close destroys the split communicator, if any, once no call uses it.
func (s *groupState) Close() error { return s.split.close() }

// state is the collectives' state of h's group.
func (h *target) state() *groupState { return h.Attached.Get(newGroupState).(*groupState) }

// splitComm is a group's communicator split by local rank, made by the
// first hierarchical all-reduce (Note [Hierarchical all-reduce]) and
// destroyed with the group. mu guards the fields; a call that uses comm
// holds mu for reading from before its first NCCL call until its last is
// enqueued, so that close (the group's Destroy, which handles may outlive)
// never destroys it under a call.
type splitComm struct {
	mu     sync.RWMutex
	comm   core.Communicator
	err    error // why the split failed (kept: a split is collective, it is not retried)
	closed bool
}

// use returns the split communicator, making it on first use (collective:
// ncclCommSplit over the parent), and the function that ends its use.
func (sc *splitComm) use(parent core.Splitter, color, key int) (core.Communicator, func(), error) {
	sc.mu.Lock()
	if !sc.closed && sc.err == nil && sc.comm == nil {
		c, err := parent.Split(color, key)
		if err == nil && c == nil {
			err = core.Errorf(core.ErrBackend, "the split by local rank %d gave no communicator", color)
		}
		if err != nil {
			sc.err = core.Errorf(core.CodeOf(err), "splitting the communicator by local rank (color %d, key %d): %v", color, key, err)
		}
		sc.comm = c
	}
	sc.mu.Unlock()
	sc.mu.RLock()
	switch {
	case sc.closed:
		sc.mu.RUnlock()
		return nil, nil, core.Errorf(core.ErrInvalidState, "the group is destroyed: its communicator split by local rank is closed")
	case sc.err != nil:
		sc.mu.RUnlock()
		return nil, nil, sc.err
	}
	return sc.comm, sc.mu.RUnlock, nil
}

// close destroys the split communicator, if any, once no call uses it;
// later uses fail.
func (sc *splitComm) close() error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.closed = true
	c := sc.comm
	sc.comm = nil
	if cl, ok := c.(core.Closer); ok {
		if err := cl.Close(); err != nil {
			return core.Errorf(core.CodeOf(err), "destroying the communicator split by local rank: %v", err)
		}
	}
	return nil
}

func (sc *splitComm) isClosed() bool {
	sc.mu.RLock()
	defer sc.mu.RUnlock()
	return sc.closed
}

// splitByLocalRank is the group's communicator split by local rank (the
// team's ranks of every machine with our local rank), made by the first
// call (collective: every rank enters it) and destroyed with the group;
// done ends this use of it.
func (h *target) splitByLocalRank() (comm core.Communicator, done func(), err error) {
	if h.Span == nil {
		return nil, nil, core.Errorf(core.ErrInvalidState, "the group does not span machines: it has no communicator to split by local rank")
	}
	parent, ok := h.Span.Engine.(core.Splitter)
	if !ok {
		name := "none"
		if h.Span.Engine != nil {
			name = h.Span.Engine.Describe()
		}
		return nil, nil, core.Errorf(core.ErrUnavailable, "splitting by local rank needs a communicator that splits (ncclCommSplit); the group has %s", name)
	}
	return h.state().split.use(parent, h.Span.LocalRank, h.Rank)
}
