package symm

import (
	"crypto/rand"
	"fmt"
	"os"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/ipc"
)

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
			g.wins = newNCCLWindows(o.Comm, cg, o.Name, g.rank, g.shareVerdict, alloc)
		}
	}
	g.span = newSpan(&g.teams, g.comm, g.cg)
	return g, nil
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
	g.gm = &groupMem{memOps: memOps{be: g.be, device: o.Device, gran: gran, name: o.Name, rank: o.Rank, world: o.World,
		timeout: o.Timeout}, abort: newAbortState(), refs: 1}
	g.gm.makeTables()
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
	if g.teams, err = formTeams(g.name, g.rank, g.world, g.members); err != nil {
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

// exchangePads makes this rank's signal pad and maps every peer's, at group
// creation (collective). Pads belong to the group, not to a buffer, so they
// are set up with it: the first rendezvous then exchanges only the buffer's
// memory, like every later one.
//
// localErr is a failure of this rank's earlier setup: the rank then makes no
// pad and tells every rank, which all fail with it.
func (g *Group) exchangePads(localErr error, tr *phaseTrace) error {
	gm := g.gm
	if localErr == nil {
		var p *pads
		p, localErr = gm.pads.make(g.padSize)
		if localErr != nil {
			localErr = core.Errorf(core.CodeOf(localErr), "rank %d: cannot make its signal pad of %d bytes: %v", g.rank, g.padSize, localErr)
		} else if g.be.Capabilities().DevicePointerArrays {
			// Device memory for handles' pointer arrays, made with the
			// group (the per-group step) rather than at the first
			// rendezvous: Note [Pointer arrays in the pad].
			if err := gm.arrays.seedDevice(p); err != nil {
				localErr = core.Errorf(core.CodeOf(err), "rank %d: device memory for pointer arrays: %v", g.rank, err)
			}
		}
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
	gm.life.Lock()
	defer gm.life.Unlock()
	if err != nil {
		gm.dropPadsLocked() // nothing on the device uses them yet; err says why
		return err
	}
	p := gm.pads.setReady()
	gm.abort.setRegion(p)
	gm.watchPeers(p.addr[gm.rank] + p.size)
	return nil
}
