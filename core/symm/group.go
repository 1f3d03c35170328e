package symm

import (
	"errors"
	"fmt"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/ipc"
	"github.com/libsymmem/libsymmem/core/lockrank"
)

// DefaultSignalPadSize is the size of each rank's signal pad unless
// SetSignalPadSize says otherwise.
const DefaultSignalPadSize = 64 << 10

// maxSignalPadSize bounds SetSignalPadSize.
const maxSignalPadSize = 1 << 30

// Options describe this process's member of a group.
type Options struct {
	Name   string // ipc.ValidateName
	Rank   int
	World  int
	Device int // the device this rank's buffers live on
	// Timeout bounds every wait of the group; <= 0 means SYMMEM_TIMEOUT_MS
	// or 5 minutes.
	Timeout time.Duration
	// AllGather, if set, carries the group's records instead of the socket
	// channel (descriptors still use the channel). It must gather
	// len(send) bytes from every rank into recv, rank r's at r*len(send).
	AllGather func(send, recv []byte) error
	// Comm, if set, is the communicator the group lives on (Note [NCCL
	// groups]): Rank, World and Device are taken from it and records are
	// all-gathered through it; leave them and AllGather unset.
	Comm Communicator
	// NoWindows turns off the registration of rendezvoused segments as
	// windows of Comm.
	NoWindows bool
	// Runtime is the allocator runtime; nil means alloc.Default().
	Runtime *alloc.Runtime
	// SocketDir and JobToken override the ipc defaults (tests).
	SocketDir string
	JobToken  string
	// machine overrides this process's identity (tests that run ranks of
	// several imitated machines in one process).
	machine *machineIdentity
}

// deviceUUIDer is implemented by backends that can name a device
// independently of CUDA_VISIBLE_DEVICES numbering.
type deviceUUIDer interface {
	DeviceUUID(device int) (string, error)
}

// Group is this process's member of a group of ranks. Safe for concurrent
// use; collective calls (Rendezvous) run one at a time per process and must
// be made in the same order on every rank.
type Group struct {
	name    string
	rank    int
	world   int
	device  int
	timeout time.Duration
	be      core.Backend
	alloc   *alloc.Allocator
	ch      *ipc.Channel
	ex      ipc.Exchange
	// meet is how the members met (Note [Member paths]): it owns ch and
	// what carries ex.
	meet memberPath
	// paths carry descriptors to the peers, in order (Note [Descriptor
	// paths]); set with the teams.
	paths   []descriptorPath
	members []memberRecord
	// machine is this process's identity (thisMachine unless a test says).
	machine machineIdentity
	teams
	// comm is set on groups over a communicator (Note [NCCL groups]), and
	// cg, which carries the group's records through it and lends its
	// staging buffers to the all-to-all across machines (Handle.Staging).
	comm Communicator
	cg   *commGather
	// wins registers rendezvoused segments as the engine's windows (Note
	// [Window registration]); noWindows on groups without them.
	wins windowRegistry
	// attached is the collectives' state of the group (Note [Collective
	// state] in core/symm/coll), which this package only closes, in
	// Destroy; every handle's description points at it.
	attached core.Attachment
	// span is what handles need to reach the ranks on other machines
	// (newSpan); nil on a group of one machine.
	span *span

	// coll serialises collective calls and guards the fields below.
	coll lockrank.Mutex[lockrank.GroupCollective]
	// padSize is the signal pad size the first rendezvous will use; fixed
	// once gm.pads exists.
	padSize   uintptr
	destroyed bool
	gm        *groupMem
	// rendezvoused is set by the first successful Rendezvous: the pad size
	// is fixed from then on (a failed one, e.g. on a pad-size mismatch,
	// leaves it open to be corrected).
	rendezvoused bool
	// scratch is what rendezvous reuse (rendezvousScratch).
	scratch rendezvousScratch
	// exchanges counts rendezvous that passed descriptors (tests check that
	// a rendezvous on an already mapped segment does not).
	exchanges int
}

// Note [Member paths]
//
// How the ranks of a group meet is one memberPath, chosen once in New, so
// that newGroup runs one sequence of phases on every group:
//
//	records   the exchange that carries the group's records (g.ex).
//	members   agreeMembers: every rank's member record, the teams, and
//	          what the path needs of them (admit).
//	connect   the channel that carries descriptors (g.ch), among the
//	          socket team.
//	pads      the signal pads, exchanged with a shared verdict.
//
// The paths:
//
//	socketMembers  (sockets_members.go) socket groups: records connects
//	               the ranks over this machine's sockets and carries the
//	               records on the channel; admit wants one machine.
//	gatherMembers  (gather_members.go) the caller's all-gather or a
//	               communicator: records carries them through it, and
//	               connect opens the channel among the local team alone,
//	               once the members say where every rank is (Note [Local
//	               teams]).
//
// A failed creation closes what the path opened (memberPath.close), as
// Destroy does.
type memberPath interface {
	// records sets the group's exchange of records.
	records(g *Group, tr *phaseTrace) error
	// admit checks what the path needs of the members, once their
	// records are agreed and the teams formed.
	admit(g *Group) error
	// connect opens the group's channel.
	connect(g *Group, tr *phaseTrace) error
	// cancel makes waits on the path's channels fail at once (Destroy,
	// Abort).
	cancel()
	// close closes what the path opened, whatever it got to.
	close() error
}

// who names rank r and its process: "rank 1 (pid 4242)".
func (g *Group) who(r int) string {
	if r >= 0 && r < len(g.members) && g.members[r].pid != 0 {
		return fmt.Sprintf("rank %d (pid %d)", r, g.members[r].pid)
	}
	return fmt.Sprintf("rank %d", r)
}

// Name, Rank, World, Device and Timeout describe the group.
func (g *Group) Name() string           { return g.name }
func (g *Group) Rank() int              { return g.rank }
func (g *Group) World() int             { return g.world }
func (g *Group) Device() int            { return g.device }
func (g *Group) Timeout() time.Duration { return g.timeout }

// SignalPadSize is the size of each rank's signal pad (the one in use after
// the first rendezvous, the one it will use before).
func (g *Group) SignalPadSize() uintptr {
	g.coll.Lock()
	defer g.coll.Unlock()
	return g.padSize
}

// SetSignalPadSize sets the size of each rank's signal pad: a multiple of 4,
// at least 4*world. Only before the group's first rendezvous; every rank
// must set the same size (the first rendezvous checks it).
func (g *Group) SetSignalPadSize(bytes uintptr) error {
	g.coll.Lock()
	defer g.coll.Unlock()
	if err := g.usable("setting the signal pad size"); err != nil {
		return err
	}
	if bytes%4 != 0 || bytes < uintptr(4*g.world) || bytes > maxSignalPadSize {
		return core.Errorf(core.ErrInvalidArgument, "group %q: a signal pad of %d bytes: it must be a multiple of 4 in [%d, %d] (4 bytes per rank and channel)", g.name, bytes, 4*g.world, maxSignalPadSize)
	}
	if g.rendezvoused {
		return core.Errorf(core.ErrInvalidState, "group %q: the signal pad size can only change before the group's first rendezvous", g.name)
	}
	if bytes == g.padSize {
		return nil
	}
	// The pads made with the group go, and with them the device slab seeded
	// with this rank's pad (Note [Pointer arrays in the pad]; no handle
	// holds a slot before the first rendezvous); the first rendezvous makes
	// and exchanges pads of the new size (and fails with ErrMismatch on
	// every rank if the ranks did not all set the same size).
	gm := g.gm
	gm.life.Lock()
	defer gm.life.Unlock()
	gm.stopWatchUnlocked() // Note [Who closes the pidfds]
	if gm.pads.current() != nil {
		err := gm.syncThen(nil, "the signal pads made with the group", gm.dropPadsLocked)
		gm.pads.forget() // left mapped if the synchronisation failed
		gm.arrays.forgetDevice()
		if err != nil {
			return core.Errorf(core.CodeOf(err), "group %q: dropping the signal pads made with the group: %v", g.name, err)
		}
	}
	g.padSize = bytes
	return nil
}

// Destroy leaves the group: it closes the channel (not collective: peers in
// a collective with us fail with ErrPeer). Handles of the group stay valid
// until released; the group's memory goes with the last of them.
// Idempotent.
//
// A collective in flight on another thread (a rendezvous) is cancelled
// first: it fails at once with ErrInvalidState rather than waiting out its
// timeout (Note [Calls in flight]). With a caller-supplied all-gather
// (Options.AllGather) the call inside it cannot be cancelled: Destroy then
// waits for it to return.
func (g *Group) Destroy() error {
	g.meet.cancel()
	g.coll.Lock()
	defer g.coll.Unlock()
	if g.destroyed {
		return nil
	}
	g.destroyed = true
	err := g.meet.close()
	if aerr := g.attached.Close(); aerr != nil {
		err = errors.Join(err, core.Errorf(core.CodeOf(aerr), "group %q: %v", g.name, aerr))
	}
	err = errors.Join(err, g.wins.close())
	g.gm.life.Lock()
	if uerr := g.gm.unrefLocked(nil); uerr != nil && err == nil {
		err = uerr
	}
	g.gm.life.Unlock()
	return err
}

// Abort aborts this rank's member of the group (Note [Abort]). Safe from any
// thread, at any time, any number of times; the first call does the work.
func (g *Group) Abort() error {
	return g.abortFor(fmt.Sprintf("symmem_group_abort on rank %d", g.rank))
}

func (g *Group) abortFor(why string) error {
	first := g.gm.abort.mark(why)
	g.meet.cancel()
	if !first {
		return nil
	}
	return g.gm.releaseDeviceWaits()
}

// usable fails a call on a destroyed or aborted group (g.coll held).
func (g *Group) usable(what string) error {
	if g.destroyed {
		return core.Errorf(core.ErrInvalidState, "group %q is destroyed", g.name)
	}
	if g.gm.abort.aborted() {
		return g.gm.abortedErr(what)
	}
	return nil
}

// settle is the outcome of a group collective that returned err: an
// interrupted one aborts the group (Note [Interrupts] in core); one that
// failed because the group was aborted meanwhile says so.
func (g *Group) settle(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case core.CodeOf(err) == core.ErrInterrupted:
		g.abortFor(fmt.Sprintf("a signal interrupted rank %d's %s", g.rank, what))
		return err
	case core.CodeOf(err) != core.ErrAborted && g.gm.abort.aborted():
		return core.Errorf(core.ErrAborted, "group %q: rank %d: %s: the group was aborted meanwhile (%s): destroy it (the call saw: %v)", g.name, g.rank, what, g.gm.abort.why, err)
	}
	return err
}

// Communicator is the group's communicator, nil for socket groups.
func (g *Group) Communicator() Communicator { return g.comm }

// shareVerdict all-gathers local outcomes: every rank gets the first
// failure, or nil.
func (g *Group) shareVerdict(what string, localErr error) error {
	raw, err := g.ex.AllGather(0, encodeStatus(statusOf(localErr)))
	if err != nil {
		return err
	}
	return g.verdictOf(what, raw)
}

// verdictOf decodes the all-gathered statuses of a step and returns the
// first failure, the same on every rank, or nil.
func (g *Group) verdictOf(what string, raw [][]byte) error {
	sts := make([]status, g.world)
	for r := range raw {
		var err error
		if sts[r], err = decodeStatus(raw[r]); err != nil {
			return core.Errorf(core.ErrPeer, "group %q: %s: rank %d sent a malformed status: %v", g.name, what, r, err)
		}
	}
	return firstFailure(g.name, what, sts)
}

// commOptions fills o's rank, world and device from o.Comm.
func commOptions(o *Options) error {
	c := o.Comm
	if o.AllGather != nil {
		return core.Errorf(core.ErrInvalidArgument, "group %q: a communicator and an all-gather function: give one", o.Name)
	}
	o.Rank, o.World, o.Device = c.Rank(), c.World(), c.Device()
	if o.World < 1 || o.Rank < 0 || o.Rank >= o.World {
		return core.Errorf(core.ErrInvalidArgument, "group %q: %s reports rank %d of %d", o.Name, c.Describe(), o.Rank, o.World)
	}
	return nil
}

// WindowCounts reports how many windows the group registered and
// deregistered, and how many it holds.
func (g *Group) WindowCounts() (registered, deregistered, live int) { return g.wins.counts() }
