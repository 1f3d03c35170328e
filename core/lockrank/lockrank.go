// Package lockrank gives the locks of the allocator and of the groups their
// place in one order (Note [Lock order]). A lock's rank is its type: a
// Mutex[Rank] is a sync.Mutex that, in a build with the symmem_lockrank tag
// (the Go tests'), fails when a goroutine takes it while holding a lock of
// the same or a later rank; without the tag it is a sync.Mutex and nothing
// more.
package lockrank

import "sync"

// Note [Lock order]
//
// A goroutine that holds several of these locks took them in this order,
// from the first listed to the last; no lock is taken while one listed
// after it is held. The list is the types below, each with its rank.
//
//	RuntimeChanging   alloc.Runtime.changing: a pause or resume of a tag on
//	                  every device; it takes each Allocator in turn.
//	GroupCollective   symm.Group.coll: one collective call of a group
//	                  (rendezvous, pause, resume, destroy); it takes any of
//	                  the locks below.
//	CommGather        symm.commGather.mu: the staging of an all-gather
//	                  through the group's communicator.
//	Allocator         alloc.Allocator.mu: one device's heap; a segment's
//	                  release runs the release hooks under it.
//	Windows           symm.ncclWindows.mu: a group's NCCL windows; the
//	                  release hook takes it under Allocator.
//	ReleaseHooks      alloc.Allocator.hookMu: adding and removing release
//	                  hooks (a release reads the list without it).
//	GroupLife         symm.groupMem.life: the references to a group's
//	                  memory and the peer watch; its last reference takes the
//	                  three tables below to give everything back.
//	PeerMappings      symm.peerMappings.mu: the peers' segments mapped here.
//	SignalPads        symm.padTable.mu: this rank's pad and the peers'.
//	PointerArrays     symm.pointerArrays.mu: the handles' pointer arrays.
//	CollectiveChannel coll's groupState.channels[channel]: one host
//	                  collective on a channel at a time; its barriers take
//	                  SignalCounts.
//	CopyEngine        coll.ceState.mu: the scratch and the watchdog of the
//	                  copy-engine calls of one group and channel.
//	Abort             symm.abortState.mu: the pad region an abort writes;
//	                  it reads the SignalCounts.
//	SignalCounts      symm.signalCounts.mu: a pad's signal numbers.
//	TagRegistry       alloc's tag registry: names to tag IDs.
//	Allocators        alloc.Runtime.mu: making a device's allocator.
//	LateCopies        symm.lateCopies: buffers of copies that timed out.
//
// Two locks are never nested within one table: a call that needs several
// tables takes them one after another. The locks absent here are held only
// by code that takes no other lock while it holds them: core.Attachment.mu
// (making a group's collective state once), coll's splitComm.mu (a
// reader-writer lock around the communicator split by local rank, taken
// with no other lock held) and coll's ceStatesMu (the map of copy-engine
// states). The Go tests run with
// the symmem_lockrank tag, so every scenario test checks the order of
// every lock it takes (check_on.go).

// Rank is a lock's place in Note [Lock order]: a goroutine takes locks in
// increasing rank.
type Rank interface {
	rank() (int, string)
}

type (
	RuntimeChanging   struct{}
	GroupCollective   struct{}
	CommGather        struct{}
	Allocator         struct{}
	Windows           struct{}
	ReleaseHooks      struct{}
	GroupLife         struct{}
	PeerMappings      struct{}
	SignalPads        struct{}
	PointerArrays     struct{}
	CollectiveChannel struct{}
	CopyEngine        struct{}
	Abort             struct{}
	SignalCounts      struct{}
	TagRegistry       struct{}
	Allocators        struct{}
	LateCopies        struct{}
)

func (RuntimeChanging) rank() (int, string)   { return 1, "RuntimeChanging" }
func (GroupCollective) rank() (int, string)   { return 2, "GroupCollective" }
func (CommGather) rank() (int, string)        { return 3, "CommGather" }
func (Allocator) rank() (int, string)         { return 4, "Allocator" }
func (Windows) rank() (int, string)           { return 5, "Windows" }
func (ReleaseHooks) rank() (int, string)      { return 6, "ReleaseHooks" }
func (GroupLife) rank() (int, string)         { return 7, "GroupLife" }
func (PeerMappings) rank() (int, string)      { return 8, "PeerMappings" }
func (SignalPads) rank() (int, string)        { return 9, "SignalPads" }
func (PointerArrays) rank() (int, string)     { return 10, "PointerArrays" }
func (CollectiveChannel) rank() (int, string) { return 11, "CollectiveChannel" }
func (CopyEngine) rank() (int, string)        { return 12, "CopyEngine" }
func (Abort) rank() (int, string)             { return 13, "Abort" }
func (SignalCounts) rank() (int, string)      { return 14, "SignalCounts" }
func (TagRegistry) rank() (int, string)       { return 15, "TagRegistry" }
func (Allocators) rank() (int, string)        { return 16, "Allocators" }
func (LateCopies) rank() (int, string)        { return 17, "LateCopies" }

// Mutex is a sync.Mutex of rank R; its zero value is unlocked.
type Mutex[R Rank] struct {
	mu sync.Mutex
}

func (m *Mutex[R]) Lock() {
	var r R
	acquire(m, r)
	m.mu.Lock()
}

func (m *Mutex[R]) Unlock() {
	release(m)
	m.mu.Unlock()
}
