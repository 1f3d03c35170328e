package coll

import (
	"sync"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// View is what a collective needs of a rendezvous' handle (core/symm's
// Handle.View implements it): every rank's block and signal pad mapped in
// this process, the bounds of its waits, the backend that runs kernels
// and, on a group that spans machines, its local team and its engine. The
// collectives know groups and handles through this interface only, so
// that membership, rendezvous and mapping know nothing of collectives.
type View interface {
	// Enter admits a collective on the handle, or says why not (the
	// handle is released, the group aborted, or the group's collectives
	// stopped after a failure: Note [Failed collectives]); the caller
	// calls leave when the call is done with the memory. Every collective
	// enters through it.
	Enter() (leave func(), err error)
	// Stopped is the error of a collective on a group whose collectives
	// stopped (Note [Failed collectives]), or nil: what Enter checks, for
	// waits that a peer's giving up ends. StopMirror is the pinned host
	// word that kernels copy the stop word into (0 where the backend runs
	// no kernels).
	Stopped() error
	StopMirror() uintptr

	// GroupName, Rank, World, Timeout, BufferSize, Offset and
	// SignalPadSize describe the handle: the rendezvoused block's size
	// and the rendezvous pointer's offset in it are the same on every
	// rank; SignalPadSize is the users' part of each pad, where the
	// library's device region starts (Note [Pad partition] in core).
	GroupName() string
	Rank() int
	World() int
	Timeout() time.Duration
	BufferSize() uintptr
	Offset() uintptr
	SignalPadSize() uintptr
	// Buffers and SignalPads are every rank's block and pad mapped here,
	// by rank (0 for a rank on another machine): the handle's own slices,
	// which the caller only reads.
	Buffers() []uintptr
	SignalPads() []uintptr
	// PointerArrays are the world-long arrays of Buffers and SignalPads
	// that kernels read: in device memory where the backend has it, else
	// in host memory.
	PointerArrays() (bufs, pads uintptr)
	// Backend is the group's backend and the device of its memory.
	Backend() (be core.Backend, device int)
	// ChannelLock serialises the host reference runner's calls on one
	// collective channel of the group (each channel's device sets take
	// one barrier at a time).
	ChannelLock(channel int) *sync.Mutex

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

	// Team is, on a group that spans machines, this rank's team (group
	// ranks ascending, Note [Local teams] in core/symm) and the pointer
	// arrays of its team view (Note [Team view]; 0 while the handle has
	// none); nil on a group of one machine.
	Team() (ranks []int, bufs, pads uintptr)
	// TeamSizes says whether every team has the same size, and names the
	// sizes ("2, 1").
	TeamSizes() (uniform bool, sizes string)
	// Engine is the group's communicator between machines (nil: none).
	Engine() core.Communicator
	// SplitByLocalRank is the group's communicator split by local rank
	// (the team's ranks of every machine with our local rank), made by
	// the first call (collective: every rank enters it) and destroyed with
	// the group; done ends this use of it.
	SplitByLocalRank() (comm core.Communicator, done func(), err error)
	// SplitClosed says whether the group was destroyed, which closed its
	// split communicator.
	SplitClosed() bool
	// EngineErr wraps a failure of the engine in what with where the other
	// machines' ranks are; NoEngine is the error of what on a group that
	// spans machines without an engine.
	EngineErr(what string, err error) error
	NoEngine(what string) error
	// Staging lends the group's staging buffers, n bytes or more each of
	// device memory (dev) and of host memory (host), to a call that uses
	// them on its stream and waits for that use before done; done ends
	// the loan, and with an error retires the buffers (a wait for the GPU
	// timed out: it may still write them). Only a group that spans
	// machines over a communicator has them.
	Staging(n uintptr) (dev, host uintptr, done func(broken error), err error)
}
