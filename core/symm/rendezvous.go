package symm

import (
	"fmt"
	"strings"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/ipc"
)

// Rendezvous is collective: every rank of the group calls it with a pointer
// into a block of its own, allocated on the group's device by the same
// sequence of calls on every rank (ptr may be interior). It validates on
// every rank that block sizes and heap offsets agree, maps every peer's
// block (once per peer segment, see Note [What a rendezvous costs]) and the
// peers' signal pads, and returns a handle. Every rank gets a handle or
// every rank gets the same error (Note [Why every verdict is shared]).
func (g *Group) Rendezvous(ptr uintptr) (*Handle, error) {
	g.coll.Lock()
	defer g.coll.Unlock()
	if err := g.usable("rendezvous"); err != nil {
		return nil, err
	}
	c := &rendezvousCall{g: g, gm: g.gm, ptr: ptr}
	h, err := c.run()
	return h, g.settle("rendezvous", err)
}

// Note [Rendezvous phases]
//
// A rendezvous (g.coll held, the group usable) is one rendezvousCall that
// runs these phases in order; a phase that returns an error ends the call,
// and undo, deferred once pin has run, gives back what the call still holds.
//
//	lookup      the block of ptr, the handle to be (its fields from the
//	            block); a failure is kept for the record. Leaves nothing.
//	pin         our signal pad (made if SetSignalPadSize dropped it), a
//	            reference on each peer mapping we hold of the block's
//	            segment (Note [Lifetimes]), the handle's pointer arrays, and
//	            the arrays filled when we hold everything the handle needs;
//	            a failure is kept for the record. Leaves the pins and the
//	            arrays to undo.
//	gather      our record, one all-gather, the records decoded. Leaves
//	            nothing new.
//	verdict     the same verdict from the same records on every rank (Note
//	            [Why every verdict is shared]); on a failure, stale peer pads
//	            are dropped on every rank. Leaves nothing new.
//	window      the segment as an NCCL window (Note [NCCL groups]), before
//	            anything is mapped, by the group's window registry (Note
//	            [Window registration]: nothing on groups without windows).
//	            The window stays with the group.
//	exchange    descriptors only where some rank lacks something
//	            (exchangeCall, Note [Descriptor exchange phases]); it ends
//	            with a verdict of its own and undoes its mappings itself on
//	            failure. Leaves the fresh mappings to makeHandle.
//	makeHandle  nothing here can fail: the fresh mappings enter the cache,
//	            the handle takes its references, the call succeeds (undo then
//	            keeps the arrays).
//	checkPeers  the handle's window, and NCCL's view of the peers' windows
//	            (NCCL >= 2.29): a collective check whose failure releases
//	            the handle on every rank.
//	undo        drops the pins; frees the arrays unless makeHandle ran.
type rendezvousCall struct {
	g   *Group
	gm  *groupMem
	ptr uintptr
	tr  *phaseTrace

	info alloc.BlockInfo
	// localErr is this rank's failure before the gather, which the record
	// carries to every rank instead of being returned early.
	localErr error
	h        *Handle
	rec      blockRecord
	// pinned[p] is our mapping of peer p's segment at the block's segment
	// offset, referenced until undo; nil where we hold none.
	pinned    []*peerMap
	recs      []blockRecord
	win       *window    // our window of the segment (register; nil without windows)
	needPads  bool       // the pads were never exchanged: the exchange passes them
	fresh     []*peerMap // segments mapped by this call
	succeeded bool
}

// run is the driver of Note [Rendezvous phases].
func (c *rendezvousCall) run() (*Handle, error) {
	if traceOn { // the arguments would be boxed even with tracing off
		c.tr = startTrace("group %q rank %d rendezvous", c.g.name, c.g.rank)
		defer c.tr.done()
	}
	c.lookup()
	c.pin()
	defer c.undo()
	if err := c.gather(); err != nil {
		return nil, err
	}
	if err := c.verdict(); err != nil {
		return nil, err
	}
	if err := c.window(); err != nil {
		return nil, err
	}
	if err := c.exchange(); err != nil {
		return nil, err
	}
	c.makeHandle()
	return c.checkPeers()
}

// lookup finds the block of ptr and shapes the handle from it.
func (c *rendezvousCall) lookup() {
	g, me := c.g, c.g.rank
	if g.alloc == nil {
		c.localErr = core.Errorf(core.ErrInvalidDevice, "no allocator for device %d", g.device)
	} else {
		var err error
		c.info, err = g.alloc.Lookup(c.ptr)
		if err != nil {
			c.localErr = core.Errorf(core.CodeOf(err), "rank %d: %v", me, err)
		} else if c.info.Segment.Paused {
			c.localErr = core.Errorf(core.ErrInvalidState, "rank %d: the block at %#x is in tag %q, which is paused", me, c.info.Addr, c.info.Segment.Tag)
		}
	}
	ptrs := make([]uintptr, 2*g.world) // bufPtrs then padPtrs
	c.h = &Handle{gm: c.gm, name: g.name, rank: me, world: g.world, bufSize: c.info.Size, offset: c.ptr - c.info.Addr,
		timeout: g.timeout, bufPtrs: ptrs[:g.world:g.world], padPtrs: ptrs[g.world:], span: g.span}
	c.h.barrierDsts, c.h.barrierSrcs = c.h.barrierRounds()
	sc := g.scratch.reset(g.world)
	c.rec = blockRecord{held: sc.held[g.world*g.world:], padSize: uint64(g.padSize)}
	c.pinned = sc.pinned
}

// pin takes what we have: our pad (made if SetSignalPadSize dropped it),
// the peers' segments we hold, and the slots of the handle's pointer
// arrays (taken now so that a rank that cannot get them fails every rank
// through the verdict).
func (c *rendezvousCall) pin() {
	g, gm, me := c.g, c.gm, c.g.rank
	var ready bool
	if c.localErr == nil {
		p, made, padsReady, err := gm.pads.ensure(g.padSize)
		ready = padsReady
		if err != nil {
			c.localErr = core.Errorf(core.CodeOf(err), "rank %d: cannot make its signal pad of %d bytes: %v", me, g.padSize, err)
		} else if made && g.be.Capabilities().DevicePointerArrays {
			// A pad of a new size (SetSignalPadSize dropped the slab with
			// the old pad): Note [Pointer arrays in the pad].
			if err := gm.arrays.seedDevice(p); err != nil {
				c.localErr = core.Errorf(core.CodeOf(err), "rank %d: device memory for pointer arrays: %v", me, err)
			}
		}
	} else {
		ready = gm.pads.isReady()
	}
	c.rec.padsReady = ready
	if c.localErr == nil {
		gm.peers.pin(c.info.Segment.HeapOff, c.pinned, c.rec.held)
		if err := c.h.allocArrays(); err != nil {
			c.localErr = core.Errorf(core.CodeOf(err), "rank %d: memory for the handle's pointer arrays: %v", me, err)
		}
	}
	// When we hold a mapping of every peer's segment and every pad, they
	// are what the handle will use unless the verdict says that one is
	// stale (then the exchange refills the arrays before its own verdict).
	holdsAll := c.localErr == nil && ready
	for p := 0; p < g.world && holdsAll; p++ {
		holdsAll = p == me || c.pinned[p] != nil || !g.isLocal(p)
	}
	if holdsAll {
		if err := c.fill(); err != nil {
			c.localErr = core.Errorf(core.CodeOf(err), "rank %d: writing the handle's pointer arrays: %v", me, err)
		}
	}
}

// fill sets the handle's pointers from the mappings (fresh ones where this
// call made them) and writes its arrays.
func (c *rendezvousCall) fill() error {
	h, info := c.h, c.info
	for p := 0; p < c.g.world; p++ {
		m := c.pinned[p]
		if c.fresh != nil && c.fresh[p] != nil {
			m = c.fresh[p]
		}
		switch {
		case p == c.g.rank:
			h.bufPtrs[p] = info.Addr
		case m != nil:
			h.bufPtrs[p] = m.addr + uintptr(info.HeapOff-info.Segment.HeapOff)
		}
	}
	c.gm.pads.addrs(h.padPtrs)
	return h.fillArrays()
}

// undo gives back the pins, and the handle's arrays unless the call
// succeeded.
func (c *rendezvousCall) undo() {
	for _, m := range c.pinned {
		if m != nil {
			c.gm.peers.put(nil, m)
		}
	}
	if !c.succeeded {
		c.h.freeArrays()
	}
}

// gather all-gathers our record (with this rank's failure, if any) and
// decodes every rank's.
func (c *rendezvousCall) gather() error {
	g, info := c.g, c.info
	c.tr.mark("lookup+pads")
	c.rec.status = statusOf(c.localErr)
	if c.localErr == nil {
		c.rec.blockSize, c.rec.requested, c.rec.offset = uint64(info.Size), uint64(info.Requested), uint64(c.ptr-info.Addr)
		c.rec.heapOff, c.rec.segHeapOff, c.rec.segSize, c.rec.segID = info.HeapOff, info.Segment.HeapOff, uint64(info.Segment.Size), info.Segment.ID
		c.rec.allocs, c.rec.frees = info.Allocs, info.Frees
		c.rec.winHeld = g.wins.held(info.Segment)
	}
	sc := &g.scratch
	sc.enc = c.rec.appendTo(sc.enc[:0])
	var raw [][]byte
	var err error
	if rx, ok := g.ex.(ipc.ReusingExchange); ok {
		raw, err = rx.AllGatherInto(0, sc.enc, sc.raw)
	} else {
		raw, err = g.ex.AllGather(0, sc.enc)
	}
	if err != nil {
		return err
	}
	c.recs = sc.recs
	for r := range raw {
		if err = decodeBlockInto(&c.recs[r], raw[r], g.world, sc.held[r*g.world:(r+1)*g.world]); err != nil {
			return core.Errorf(core.ErrPeer, "group %q: rendezvous: rank %d sent a malformed record: %v", g.name, r, err)
		}
	}
	c.tr.mark("allgather")
	return nil
}

// verdict is the same verdict on every rank, from the same records; a
// failure drops the peers' pads where they are stale.
func (c *rendezvousCall) verdict() error {
	if err := c.check(); err != nil {
		c.dropStalePeerPads()
		return err
	}
	return nil
}

// window registers the segment as a window of the group's engine, where
// its group has windows (Note [Window registration]), before anything is
// mapped, so that a failure here leaves nothing to undo.
func (c *rendezvousCall) window() error {
	x, err := c.g.wins.register(c.info.Segment, c.recs, c.tr)
	c.win = x
	return err
}

// need(r, p): rank r lacks peer p's current segment, and p is on r's
// machine (Note [Local teams]: remote ranks are never mapped).
func (c *rendezvousCall) need(r, p int) bool {
	return r != p && c.g.sameTeam(r, p) && c.recs[r].held[p] != c.recs[p].segID+1
}

// exchange passes descriptors, only where some rank lacks something; the
// exchange ends with a verdict of its own, after the arrays are refilled.
func (c *rendezvousCall) exchange() error {
	g := c.g
	c.needPads = !c.recs[0].padsReady
	anyNeed := c.needPads
	for r := 0; r < g.world && !anyNeed; r++ {
		for p := 0; p < g.world; p++ {
			anyNeed = anyNeed || c.need(r, p)
		}
	}
	if !anyNeed {
		return nil
	}
	c.fresh = make([]*peerMap, g.world)
	g.exchanges++
	x := &exchangeCall{g: g, gm: c.gm, info: c.info, recs: c.recs, needPads: c.needPads, need: c.need, fresh: c.fresh, prepare: c.fill, tr: c.tr}
	return x.run()
}

// makeHandle completes the handle: nothing here can fail, so every rank
// succeeds.
func (c *rendezvousCall) makeHandle() {
	g, gm, h := c.g, c.gm, c.h
	gm.life.Lock()
	defer gm.life.Unlock()
	p := gm.pads.current()
	if c.needPads {
		p = gm.pads.setReady()
		gm.abort.setRegion(p)
		gm.watchPeers(p.addr[gm.rank] + p.size)
	}
	h.padSize, h.sig, h.stopRead, h.stopMirror = p.size, p.sig, p.stopRead, p.stopMirror
	h.maps = gm.peers.hold(c.fresh, c.pinned, func(p int) bool { return p != g.rank && g.isLocal(p) })
	h.sym = h.describe(&g.attached)
	c.tr.mark("handle")
	gm.refs++
	g.rendezvoused = true // only now: a failed rendezvous leaves the pad size open
	c.succeeded = true
}

// checkPeers gives the handle its window and checks NCCL's view of the
// peers' windows (NCCL >= 2.29; Note [Window registration]): a collective
// check whose failure releases the handle on every rank.
func (c *rendezvousCall) checkPeers() (*Handle, error) {
	h, info := c.h, c.info
	if c.win != nil {
		h.window, h.windowOffset = c.win, c.ptr-info.Segment.Addr
	}
	if err := c.g.wins.checkPeers(c.win, info.Addr-info.Segment.Addr, h.bufPtrs, h.bufSize, c.tr); err != nil {
		h.Release()
		return nil, err
	}
	return h, nil
}

// dropStalePeerPads: when the ranks' pads differ in size or in whether they
// were exchanged (a rank set another pad size, which replaced its pad), every
// rank unmaps its mappings of the peers' pads, so that the next rendezvous
// exchanges the pads again on every rank (a failed rendezvous does not fix
// the group's pads for good). Every rank decides it from the same records.
func (c *rendezvousCall) dropStalePeerPads() {
	recs := c.recs
	same := true
	for r := range recs {
		same = same && recs[r].padSize == recs[0].padSize && recs[r].padsReady == recs[0].padsReady
	}
	if same {
		return
	}
	// The error of the rendezvous is the one reported; a failure here
	// leaves the peers' pads mapped (syncThen), and ready false.
	c.gm.pads.dropReadyPeers()
}

// check is the verdict on the gathered records; every rank computes the
// same result. Each field is compared as a number first and described for
// the message only where the ranks differ: a rendezvous again compares
// every rank's record without formatting any of it.
func (c *rendezvousCall) check() error {
	name, world, recs := c.g.name, c.g.world, c.recs
	for r := range recs {
		if recs[r].status.code == core.Success {
			continue
		}
		sts := make([]status, world)
		for r := range recs {
			sts[r] = recs[r].status
		}
		return firstFailure(name, "rendezvous", sts)
	}
	if !recsAgree(recs, func(b *blockRecord) uint64 { return b.padSize }) {
		d := core.RanksByValue(world, func(r int) string { return fmt.Sprintf("%d bytes", recs[r].padSize) })
		return core.Errorf(core.ErrMismatch, "group %q: rendezvous: the signal pad sizes differ (%s): set the same size on every rank before the first rendezvous", name, d)
	}
	if !recsAgree(recs, func(b *blockRecord) uint64 { return boolWord(b.padsReady) }) {
		d := core.RanksByValue(world, func(r int) string { return fmt.Sprint(recs[r].padsReady) })
		return core.Errorf(core.ErrInternal, "group %q: rendezvous: the ranks disagree on whether the signal pads were exchanged (%s)", name, d)
	}
	// Blocks are compared, not requests: requests that round to the same
	// block are symmetric.
	if !recsAgree(recs, func(b *blockRecord) uint64 { return b.blockSize }) {
		d := core.RanksByValue(world, func(r int) string { return fmt.Sprintf("block of %d bytes", recs[r].blockSize) })
		req := make([]string, world)
		for r := range req {
			req[r] = fmt.Sprintf("rank %d: %d", r, recs[r].requested)
		}
		return core.Errorf(core.ErrMismatch, "group %q: rendezvous on blocks of different sizes: %s; every rank must pass an allocation of the same size (bytes requested: %s)",
			name, d, strings.Join(req, ", "))
	}
	if !recsAgree(recs, func(b *blockRecord) uint64 { return b.heapOff }) {
		d := core.RanksByValue(world, func(r int) string { return fmt.Sprintf("heap offset %#x", recs[r].heapOff) })
		counters := make([]string, world)
		for r := range counters {
			counters[r] = fmt.Sprintf("rank %d: %d allocs, %d frees", r, recs[r].allocs, recs[r].frees)
		}
		return core.Errorf(core.ErrMismatch, "group %q: rendezvous on blocks at different heap offsets (%s): placement diverged; every rank must make the same allocations and frees, in the same order, before a rendezvous. Allocator counters: %s",
			name, d, strings.Join(counters, "; "))
	}
	if !recsAgree(recs, func(b *blockRecord) uint64 { return b.segHeapOff }) || !recsAgree(recs, func(b *blockRecord) uint64 { return b.segSize }) {
		d := core.RanksByValue(world, func(r int) string {
			return fmt.Sprintf("segment at heap offset %#x of %d bytes", recs[r].segHeapOff, recs[r].segSize)
		})
		return core.Errorf(core.ErrMismatch, "group %q: rendezvous: the blocks lie in different segments (%s): placement diverged", name, d)
	}
	if !recsAgree(recs, func(b *blockRecord) uint64 { return b.offset }) {
		d := core.RanksByValue(world, func(r int) string { return fmt.Sprintf("offset %d", recs[r].offset) })
		return core.Errorf(core.ErrMismatch, "group %q: rendezvous on pointers at different offsets in their blocks (%s): every rank must pass the same offset into its block", name, d)
	}
	return nil
}

// recsAgree says whether field has one value in every record.
func recsAgree(recs []blockRecord, field func(*blockRecord) uint64) bool {
	for r := 1; r < len(recs); r++ {
		if field(&recs[r]) != field(&recs[0]) {
			return false
		}
	}
	return true
}

func boolWord(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// Note [Descriptor exchange phases]
//
// An exchangeCall passes the descriptors that some rank lacks (the peers'
// pads on the first rendezvous or at group creation, and segments not yet
// held), maps what arrives, and all-gathers the outcome; on failure every
// rank undoes what it mapped. Its phases, in order (export, send and
// mapArrived are socketPath's, fabric is fabricPath's: Note [Descriptor
// paths]):
//
//	export      descriptors of our pad and segment where a rank by socket
//	            needs them; a failure is kept for the verdict. Leaves the
//	            descriptors to send (closed by send).
//	send        the all-to-all of descriptors; a failure here returns at
//	            once unless this rank alone ran short of descriptors (then
//	            the verdict tells every rank). Leaves the descriptors that
//	            arrived, ours closed.
//	mapArrived  every descriptor that arrived is imported and mapped (the
//	            pads into gm.pads, segments into fresh) or
//	            closed. Leaves the mappings to undo.
//	fabric      the same between the machines of a team, through fabric
//	            handles (Note [Fabric teams]). Leaves its mappings to undo.
//	prepare     the caller's step (a rendezvous fills the handle's arrays),
//	            if nothing failed. Leaves nothing.
//	verdict     everyone succeeds or everyone undoes: an all-gather of the
//	            outcome.
//	undo        on a failed verdict: the fresh mappings and the peers' pads
//	            are unmapped and released.
type exchangeCall struct {
	g    *Group
	gm   *groupMem
	info alloc.BlockInfo // the rendezvous' block (zero at group creation)
	recs []blockRecord   // the rendezvous' records (nil at group creation)
	// needPads says that the pads travel; need(r, p) that rank r lacks
	// peer p's segment.
	needPads bool
	need     func(r, p int) bool
	// fresh receives the segments this call maps, by peer.
	fresh []*peerMap
	// prepare, if set, runs once what arrived is mapped and before the
	// final verdict: its failure is this rank's failure,
	// shared with all.
	prepare func() error
	tr      *phaseTrace

	localErr     error // this rank's first failure, for the verdict
	padFD, segFD int
	in           [][]int // the descriptors that arrived, by sender
	// fdErr is set when this rank alone ran out of descriptors receiving.
	fdErr error
}

// run is the driver of Note [Descriptor exchange phases].
func (x *exchangeCall) run() error {
	for _, p := range x.g.paths {
		if err := p.exchange(x); err != nil {
			return err
		}
	}
	x.runPrepare()
	if err := x.verdict(); err != nil {
		x.undo()
		return err
	}
	return nil
}

// note keeps err as this rank's failure unless one came first.
func (x *exchangeCall) note(err error) {
	if x.localErr == nil && err != nil {
		x.localErr = core.Errorf(core.CodeOf(err), "rank %d: %v", x.g.rank, err)
	}
}

// runPrepare runs the caller's step if nothing failed.
func (x *exchangeCall) runPrepare() {
	if x.localErr == nil && x.prepare != nil {
		x.note(x.prepare())
	}
	x.tr.mark("import+map")
}

// verdict: everyone succeeds or everyone undoes.
func (x *exchangeCall) verdict() error {
	raw, err := x.g.ex.AllGather(0, encodeStatus(statusOf(x.localErr)))
	if err != nil && x.fdErr != nil {
		err = x.fdErr // the verdict could not be shared (records on the broken channel): ours is the cause
	}
	if err == nil {
		err = x.g.verdictOf("rendezvous (mapping peers' memory)", raw)
	}
	return err
}

// undo unmaps and releases what this call mapped, after a failed verdict.
func (x *exchangeCall) undo() {
	for i, m := range x.fresh {
		if m != nil {
			x.gm.unmapRelease(m.addr, m.size, m.mem)
			x.fresh[i] = nil
		}
	}
	if x.needPads {
		x.gm.pads.dropPeers()
	}
}
