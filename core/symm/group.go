package symm

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/ipc"
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
	coll sync.Mutex
	// padSize is the signal pad size the first rendezvous will use; fixed
	// once gm.pads exists.
	padSize   uintptr
	destroyed bool
	gm        *groupMem
	// rendezvoused is set by the first successful Rendezvous: the pad size
	// is fixed from then on (a failed one, e.g. on a pad-size mismatch,
	// leaves it open to be corrected).
	rendezvoused bool
	// rdv is the rendezvous in progress; scratch what rendezvous reuse
	// (rendezvousScratch).
	rdv     rendezvousCall
	scratch rendezvousScratch
	// exchanges counts rendezvous that passed descriptors (tests check that
	// a rendezvous on an already mapped segment does not).
	exchanges int
}

// New creates this process's member of a group. Collective: every rank
// calls it; it returns when all have joined and agree on where they are
// (one backend, one machine, distinct devices), or fails on every rank with
// the same error within the timeout.
func New(o Options) (*Group, error) {
	if err := ipc.ValidateName(o.Name); err != nil {
		return nil, err
	}
	if o.Comm != nil {
		if err := commOptions(&o); err != nil {
			return nil, err
		}
	}
	if o.World < 1 || o.Rank < 0 || o.Rank >= o.World {
		return nil, core.Errorf(core.ErrInvalidArgument, "group %q: rank %d and world size %d: need 0 <= rank < world size", o.Name, o.Rank, o.World)
	}
	if o.Timeout <= 0 {
		o.Timeout = ipc.DefaultTimeout()
	}
	rt := o.Runtime
	if rt == nil {
		var err error
		if rt, err = alloc.Default(); err != nil {
			return nil, err
		}
	}
	if rt.Backend == nil {
		return nil, core.Errorf(core.ErrUnavailable, "group %q: no backend: %s", o.Name, rt.NotesText())
	}
	// Arguments are checked before anything collective, so that a bad call
	// returns at once (the peers then time out naming this rank).
	alloc, err := rt.Allocator(o.Device)
	if err != nil {
		return nil, core.Errorf(core.CodeOf(err), "group %q: rank %d: %v", o.Name, o.Rank, err)
	}
	// Blocks that threads freed before the group are given back to the pools
	// (Note [Thread caches] in core/alloc/threadcache.go), so that a rank's scratch
	// allocations freed before the group leave its symmetric placement as
	// if they had not been made.
	alloc.DrainThreadCaches()

	// How the members meet is chosen once, here (Note [Member paths]).
	var meet memberPath = &socketMembers{o: o}
	var cg *commGather
	switch {
	case o.Comm != nil:
		if cg, err = newCommGather(o.Comm, rt.Backend, o.Device, o.Name, o.Timeout); err != nil {
			return nil, core.Errorf(core.CodeOf(err), "group %q: rank %d: a stream for %s: %v", o.Name, o.Rank, o.Comm.Describe(), err)
		}
		meet = &gatherMembers{o: o, fn: cg.allGather, done: cg.close}
	case o.AllGather != nil:
		meet = &gatherMembers{o: o, fn: o.AllGather, done: func() error { return nil }}
	}
	g, err := newGroup(o, rt, alloc, meet)
	if err != nil {
		meet.close()
		return nil, err
	}
	// What the group registers with its engine is chosen once, here (Note
	// [Window registration]).
	g.wins = noWindows{}
	if cg != nil {
		g.comm, g.cg = o.Comm, cg
		if !o.NoWindows {
			g.wins = newNCCLWindows(o.Comm, cg, o.Name, alloc)
		}
	}
	g.span = newSpan(&g.teams, g.comm, g.cg)
	return g, nil
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

// newGroup is New once the member path is known: the phases of Note
// [Member paths]. On failure the caller closes meet.
func newGroup(o Options, rt *alloc.Runtime, alloc *alloc.Allocator, meet memberPath) (*Group, error) {
	tr := startTrace("group %q rank %d creation", o.Name, o.Rank)
	defer tr.done()
	g := &Group{name: o.Name, rank: o.Rank, world: o.World, device: o.Device, timeout: o.Timeout,
		be: rt.Backend, alloc: alloc, padSize: DefaultSignalPadSize, machine: thisMachine, meet: meet}
	if o.machine != nil {
		g.machine = *o.machine
	}
	if err := meet.records(g, tr); err != nil {
		return nil, err
	}
	if err := g.agreeMembers(); err != nil {
		return nil, err
	}
	tr.mark("members")
	if err := meet.connect(g, tr); err != nil {
		return nil, err
	}
	// What fails here fails on this rank only; it is carried into the pad
	// exchange's all-gathered status, so that every rank returns the same
	// verdict (Note [Why every verdict is shared]).
	gran, localErr := g.be.Granularity(o.Device)
	if localErr != nil {
		localErr = core.Errorf(core.CodeOf(localErr), "rank %d: the backend's granularity: %v", o.Rank, localErr)
	}
	g.gm = &groupMem{be: g.be, device: o.Device, gran: gran, name: o.Name, rank: o.Rank, world: o.World,
		timeout: o.Timeout, refs: 1, maps: map[mapKey]*peerMap{}, abort: newAbortState()}
	if localErr == nil {
		g.gm.live, localErr = ipc.NewLiveness(o.Name, o.Rank, g.socketTeamPids())
	}
	if err := g.exchangePads(localErr, tr); err != nil {
		g.gm.live.Close()
		return nil, err
	}
	return g, nil
}

// socketTeamPids is the pid of every rank of the socket team (as the
// channel's peer credentials give them), by group rank, and 0 for the ranks
// outside it: a pid names a process only under this machine's kernel, so
// ranks on other machines (NCCL or fabric teams) are never watched by pid
// (Note [Dead peers]); their death reaches us through the engine.
func (g *Group) socketTeamPids() []int32 {
	byChannel := g.ch.Pids()
	pids := make([]int32, g.world)
	for i, r := range g.sock {
		if i < len(byChannel) {
			pids[r] = byChannel[i]
		}
	}
	return pids
}

// agreeMembers all-gathers every rank's member record and checks that the
// ranks can share memory: one backend, machine identities that hold
// together (Note [Machine identity]), what the member path needs (one
// machine for socket groups: Note [Member paths]), and
// distinct devices on each machine unless SYMMEM_ALLOW_OVERLAPPING_DEVICES=1
// on every rank (the host backend has one device, which every rank shares
// by design). It sets the group's local team (Note [Local teams]).
func (g *Group) agreeMembers() error {
	me := memberRecord{pid: uint32(os.Getpid()), backend: g.be.Name(),
		hostname: g.machine.hostname, bootID: g.machine.bootID, simulated: g.machine.simulated, device: int32(g.device)}
	if g.machine.err != nil {
		me.status = statusOf(core.Errorf(core.CodeOf(g.machine.err), "rank %d (pid %d): %v", g.rank, me.pid, g.machine.err))
	}
	rand.Read(me.nonce[:])
	if f, ok := g.be.(fabricBackend); ok {
		// The answer is the record's; a failure to ask is this rank's
		// failure (the device is broken), reported to every rank.
		dom, _, err := f.FabricDomain(g.device)
		if err != nil && me.status.code == core.Success {
			me.status = statusOf(core.Errorf(core.CodeOf(err), "rank %d: the device's fabric domain: %v", g.rank, err))
		}
		me.fabric = dom
	}
	if u, ok := g.be.(deviceUUIDer); ok {
		if s, err := u.DeviceUUID(g.device); err == nil {
			me.uuid = s
		}
	}
	me.overlap = core.Current().Bool("SYMMEM_ALLOW_OVERLAPPING_DEVICES", false)
	raw, err := g.ex.AllGather(0, me.encode())
	if err != nil {
		return err
	}
	g.members = make([]memberRecord, g.world)
	sts := make([]status, g.world)
	for r, b := range raw {
		m, err := decodeMember(b)
		if err != nil {
			return core.Errorf(core.ErrPeer, "group %q: rank %d sent a malformed member record: %v", g.name, r, err)
		}
		g.members[r], sts[r] = m, m.status
	}
	if err := firstFailure(g.name, "group creation", sts); err != nil {
		return err
	}
	ms := g.members
	if d := core.RanksByValue(g.world, func(r int) string { return ms[r].backend }); d != "" {
		return core.Errorf(core.ErrMismatch, "group %q: the ranks use different backends (%s): set SYMMEM_BACKEND alike on every rank", g.name, d)
	}
	if err := g.formTeams(); err != nil {
		return err
	}
	g.paths = pathsFor(&g.teams)
	if err := g.meet.admit(g); err != nil {
		return err
	}
	if g.be.Capabilities().SharedDevice { // every rank has the same backend by now
		return nil
	}
	overlapOK := true
	for _, m := range ms {
		overlapOK = overlapOK && m.overlap
	}
	if overlapOK {
		return nil
	}
	seen := map[string]int{}
	for r, m := range ms {
		what := "device " + m.uuid
		if m.uuid == "" {
			what = fmt.Sprintf("device %d", m.device)
		}
		key := fmt.Sprintf("%d/%s", g.machineOf[r], what) // device numbers repeat across machines
		if q, ok := seen[key]; ok {
			return core.Errorf(core.ErrMismatch, "group %q: ranks %d and %d both use %s; each rank needs its own device (set SYMMEM_ALLOW_OVERLAPPING_DEVICES=1 on every rank to allow it for testing)", g.name, q, r, what)
		}
		seen[key] = r
	}
	return nil
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
	gm.mu.Lock()
	defer gm.mu.Unlock()
	gm.stopWatchUnlocked() // Note [Who closes the pidfds]
	if gm.pads != nil {
		err := gm.syncThen("the signal pads made with the group", gm.dropPadsLocked)
		gm.pads, gm.dev = nil, nil // left mapped if the synchronisation failed
		if err != nil {
			return core.Errorf(core.CodeOf(err), "group %q: dropping the signal pads made with the group: %v", g.name, err)
		}
	}
	g.padSize = bytes
	return nil
}

// exchangePads makes this rank's signal pad and maps every peer's, at group
// creation (collective). Pads belong to the group, not to a buffer, so they
// are set up with it: the first rendezvous then exchanges only the buffer's
// memory, like every later one.
//
// localErr is a failure of this rank's earlier setup: the rank then makes no
// pad and tells every rank, which all fail with it.
func (g *Group) exchangePads(localErr error, tr *phaseTrace) error {
	gm := g.gm
	var p *pads
	if localErr == nil {
		gm.mu.Lock()
		p, localErr = gm.makePads(g.padSize)
		gm.pads = p
		if localErr != nil {
			localErr = core.Errorf(core.CodeOf(localErr), "rank %d: cannot make its signal pad of %d bytes: %v", g.rank, g.padSize, localErr)
		} else if g.be.Capabilities().DevicePointerArrays {
			// Device memory for handles' pointer arrays, made with the
			// group (the per-group step) rather than at the first
			// rendezvous: Note [Pointer arrays in the pad].
			if err := gm.makeDeviceSlab(p); err != nil {
				localErr = core.Errorf(core.CodeOf(err), "rank %d: device memory for pointer arrays: %v", g.rank, err)
			}
		}
		gm.mu.Unlock()
		tr.mark("make-pad")
	}
	// Every rank learns whether every rank has a pad before descriptors move.
	err := g.shareVerdict("group creation (signal pads)", localErr)
	if err == nil {
		none := func(r, p int) bool { return false } // no buffer segments here
		tr.mark("pad-status")
		x := &exchangeCall{g: g, gm: gm, needPads: true, need: none, fresh: make([]*peerMap, g.world), tr: tr}
		err = x.run()
	}
	gm.mu.Lock()
	defer gm.mu.Unlock()
	if err != nil {
		gm.dropPadsLocked() // nothing on the device uses them yet; err says why
		return err
	}
	gm.pads.ready = true
	gm.abort.setRegion(gm.pads)
	gm.watchPeers(gm.pads.addr[gm.rank] + gm.pads.size)
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
	g.gm.mu.Lock()
	if uerr := g.gm.unrefLocked(); uerr != nil && err == nil {
		err = uerr
	}
	g.gm.mu.Unlock()
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
