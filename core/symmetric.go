package core

import (
	"sync"
	"sync/atomic"
	"time"
)

// SymmetricBuffer describes one rendezvous's result as the collectives
// (core/symm/coll) take it: every rank's block and signal pad mapped in
// this process and the bounds of the handle's waits. core/symm makes it
// once, when the rendezvous completes, and it never changes after: a
// collective copies it, reads it without a lock, and reaches what does
// change (the handle's release, the group's abort, the stop word, the
// staging memory) through the handle's port (coll.Port).
type SymmetricBuffer struct {
	GroupName   string
	Rank, World int
	// Timeout bounds every wait of the group.
	Timeout time.Duration
	// BufferSize is the rendezvoused block's size and Offset the
	// rendezvous pointer's offset in it, the same on every rank;
	// SignalPadSize is the users' part of each pad, where the library's
	// device region starts (Note [Pad partition]).
	BufferSize, Offset, SignalPadSize uintptr
	// Buffers and SignalPads are every rank's block and pad mapped here,
	// by rank (0 for a rank on another machine): the handle's own slices,
	// which readers only read.
	Buffers, SignalPads []uintptr
	// BufferArray and PadArray are the world-long arrays of Buffers and
	// SignalPads that kernels read: in device memory where the backend
	// has it, else in host memory.
	BufferArray, PadArray uintptr
	// StopMirror is the pinned host word that kernels copy this rank's
	// stop word into (0 where the backend runs no kernels).
	StopMirror uintptr
	// Backend is the group's backend, Device the device of its memory.
	Backend Backend
	Device  int
	// Span is how the group spans machines; nil on a group of one
	// machine. TeamBufferArray and TeamPadArray are the pointer arrays of
	// the handle's team view (the team's blocks, then its pads; Note
	// [Team view] in core/symm/coll), 0 on one machine.
	Span                          *MachineSpan
	TeamBufferArray, TeamPadArray uintptr
	// Attached is the group's place for the collectives' own state
	// (every handle of the group points at the same one).
	Attached *Attachment
}

// MachineSpan is what a group that spans machines knows of its ranks on
// the other machines (Note [Local teams] and Note [Collectives across
// machines] in core/symm): made once with the group, never changed.
type MachineSpan struct {
	GroupName string
	Rank      int
	// Team is this rank's team (group ranks, ascending) and LocalRank
	// its index in it.
	Team      []int
	LocalRank int
	// Uniform says whether every team has len(Team) ranks; TeamSizes
	// names the sizes of the teams ("2, 1").
	Uniform   bool
	TeamSizes string
	// Machines is the number of machines, Here names this one, Remote the
	// ranks of the other teams by machine ("rank(s) 2, 3 on b").
	Machines     int
	Here, Remote string
	// Engine is the group's communicator between machines (nil: none).
	Engine Communicator
}

// NoEngine is the error of what, an operation that needs an engine
// between machines, on a group that has none.
func (m *MachineSpan) NoEngine(what string) error {
	return Errorf(ErrUnavailable, "group %q: %s needs an engine between machines: the group spans %d machines (this is %s; %s) and was made without a communicator (symmem_group_create_with_allgather); make it over an NCCL communicator (symmem_group_create_nccl)",
		m.GroupName, what, m.Machines, m.Here, m.Remote)
}

// EngineErr wraps err, a failure of the engine in what, with where the
// ranks of the other machines are.
func (m *MachineSpan) EngineErr(what string, err error) error {
	return Errorf(CodeOf(err), "group %q: rank %d: %s over %s: %v (ranks on other machines: %s)", m.GroupName, m.Rank, what, m.Engine.Describe(), err, m.Remote)
}

// Attachment is where a package above core/symm keeps state of one group
// that core/symm neither makes nor reads (the collectives' channel locks
// and communicator split by local rank, Note [Collective state] in
// core/symm/coll). The package makes the value at its first Get; the
// group's destruction closes it. The zero value is empty and open.
type Attachment struct {
	value atomic.Value // the Closer that the first Get made
	// mu orders the first Get and Close; closed says that Close ran.
	mu     sync.Mutex
	closed bool
}

// Get is the attached value, made by make at the first call; a value made
// after Close is made closed (closed is then true). Once made, Get is one
// atomic load.
func (a *Attachment) Get(make func(closed bool) Closer) Closer {
	if v := a.value.Load(); v != nil {
		return v.(Closer)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if v := a.value.Load(); v != nil {
		return v.(Closer)
	}
	v := make(a.closed)
	a.value.Store(v)
	return v
}

// Close closes the attached value, if one was made, and makes later ones
// closed. A second Close does nothing.
func (a *Attachment) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	if v := a.value.Load(); v != nil {
		return v.(Closer).Close()
	}
	return nil
}
