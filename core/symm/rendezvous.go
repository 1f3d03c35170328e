package symm

import (
	"fmt"
	"strings"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/ipc"
	"golang.org/x/sys/unix"
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
	if g.destroyed {
		return nil, core.Errorf(core.ErrInvalidState, "group %q is destroyed", g.name)
	}
	gm := g.gm
	world, me := g.world, g.rank
	tr := startTrace("group %q rank %d rendezvous", g.name, me)
	defer tr.done()

	// 1. What we have: the block, our pad, the peers' segments we hold, and
	// the slots of the handle's pointer arrays (taken now so that a rank
	// that cannot get them fails every rank through the verdict).
	var info alloc.BlockInfo
	var localErr error
	if g.alloc == nil {
		localErr = core.Errorf(core.ErrInvalidDevice, "no allocator for device %d", g.device)
	} else {
		info, localErr = g.alloc.Lookup(ptr)
		if localErr != nil {
			localErr = core.Errorf(core.CodeOf(localErr), "rank %d: %v", me, localErr)
		} else if info.Segment.Paused {
			localErr = core.Errorf(core.ErrInvalidState, "rank %d: the block at %#x is in tag %q, which is paused", me, info.Addr, info.Segment.Tag)
		}
	}
	h := &Handle{gm: gm, life: newLifetime(), name: g.name, rank: me, world: world, bufSize: info.Size, offset: ptr - info.Addr,
		timeout: g.timeout, bufPtrs: make([]uintptr, world), padPtrs: make([]uintptr, world), span: g.span}
	rec := blockRecord{held: make([]uint64, world), padSize: uint64(g.padSize)}
	pinned := make([]*peerMap, world)
	succeeded := false
	gm.mu.Lock()
	if gm.pads == nil && localErr == nil {
		if gm.pads, localErr = gm.makePads(g.padSize); localErr != nil {
			localErr = core.Errorf(core.CodeOf(localErr), "rank %d: cannot make its signal pad of %d bytes: %v", me, g.padSize, localErr)
		} else if g.be.Capabilities().DevicePointerArrays && gm.dev == nil {
			// A pad of a new size (SetSignalPadSize dropped the slab with
			// the old pad): Note [Pointer arrays in the pad].
			if err := gm.makeDeviceSlab(gm.pads); err != nil {
				localErr = core.Errorf(core.CodeOf(err), "rank %d: device memory for pointer arrays: %v", me, err)
			}
		}
	}
	if gm.pads != nil {
		rec.padsReady = gm.pads.ready
	}
	if localErr == nil {
		for p := 0; p < world; p++ {
			if m := gm.maps[mapKey{p, info.Segment.HeapOff}]; m != nil && p != me && !m.paused {
				m.refs++ // pinned until we return (Note [Lifetimes])
				pinned[p] = m
				rec.held[p] = m.id + 1
			}
		}
		if err := h.allocArrays(); err != nil {
			localErr = core.Errorf(core.CodeOf(err), "rank %d: memory for the handle's pointer arrays: %v", me, err)
		}
	}
	// fill sets the handle's pointers from the mappings (fresh ones where
	// this call made them) and writes its arrays; gm.mu held.
	fill := func(fresh []*peerMap) error {
		for p := 0; p < world; p++ {
			m := pinned[p]
			if fresh != nil && fresh[p] != nil {
				m = fresh[p]
			}
			switch {
			case p == me:
				h.bufPtrs[p] = info.Addr
			case m != nil:
				h.bufPtrs[p] = m.addr + uintptr(info.HeapOff-info.Segment.HeapOff)
			}
		}
		copy(h.padPtrs, gm.pads.addr)
		return h.fillArrays()
	}
	// When we hold a mapping of every peer's segment and every pad, they
	// are what the handle will use unless the verdict says that one is
	// stale (then the exchange refills the arrays before its own verdict).
	holdsAll := localErr == nil && gm.pads.ready
	for p := 0; p < world && holdsAll; p++ {
		holdsAll = p == me || pinned[p] != nil || !g.isLocal(p)
	}
	if holdsAll {
		if err := fill(nil); err != nil {
			localErr = core.Errorf(core.CodeOf(err), "rank %d: writing the handle's pointer arrays: %v", me, err)
		}
	}
	gm.mu.Unlock()
	defer func() {
		gm.mu.Lock()
		for _, m := range pinned {
			if m != nil {
				gm.putMapLocked(m)
			}
		}
		if !succeeded {
			h.freeArrays()
		}
		gm.mu.Unlock()
	}()
	tr.mark("lookup+pads")
	rec.status = statusOf(localErr)
	if localErr == nil {
		rec.blockSize, rec.requested, rec.offset = uint64(info.Size), uint64(info.Requested), uint64(ptr-info.Addr)
		rec.heapOff, rec.segHeapOff, rec.segSize, rec.segID = info.HeapOff, info.Segment.HeapOff, uint64(info.Segment.Size), info.Segment.ID
		rec.allocs, rec.frees = info.Allocs, info.Frees
		if g.wins != nil {
			rec.winHeld = g.wins.held(info.Segment.HeapOff, info.Segment.ID)
		}
	}

	// 2. One all-gather, and the same verdict everywhere.
	raw, err := g.ex.AllGather(0, rec.encode())
	if err != nil {
		return nil, err
	}
	recs := make([]blockRecord, world)
	for r := range raw {
		if recs[r], err = decodeBlock(raw[r], world); err != nil {
			return nil, core.Errorf(core.ErrPeer, "group %q: rendezvous: rank %d sent a malformed record: %v", g.name, r, err)
		}
	}
	tr.mark("allgather")
	if err := g.verdict(recs); err != nil {
		g.dropStalePeerPads(recs)
		return nil, err
	}

	// 2b. The segment as an NCCL window (Note [NCCL groups]), before
	// anything is mapped, so that a failure here leaves nothing to undo.
	var win *window
	if g.wins != nil {
		if win, err = g.registerWindow(info, recs); err != nil {
			return nil, err
		}
		tr.mark("nccl-window")
	}

	// 3. Descriptors, only where some rank lacks something; the exchange
	// ends with a verdict of its own, after the arrays are refilled.
	needPads := !recs[0].padsReady
	// need(r, p): rank r lacks peer p's current segment, and p is on r's
	// machine (Note [Local teams]: remote ranks are never mapped).
	need := func(r, p int) bool {
		return r != p && g.sameTeam(r, p) && recs[r].held[p] != recs[p].segID+1
	}
	anyNeed := needPads
	for r := 0; r < world && !anyNeed; r++ {
		for p := 0; p < world; p++ {
			anyNeed = anyNeed || need(r, p)
		}
	}
	fresh := make([]*peerMap, world) // segments mapped by this call
	if anyNeed {
		g.exchanges++
		if err := g.exchange(info, recs, needPads, need, fresh, func() error { return fill(fresh) }, tr); err != nil {
			return nil, err
		}
	}

	// 4. The handle: nothing here can fail, so every rank succeeds.
	gm.mu.Lock()
	if needPads {
		gm.pads.ready = true
		gm.watchPeers(gm.pads.addr[gm.rank] + gm.pads.size)
	}
	h.padSize, h.sig = gm.pads.size, gm.pads.sig
	for p := 0; p < world; p++ {
		if p == me || !g.isLocal(p) {
			continue
		}
		m := fresh[p]
		if m != nil {
			// A newer segment replaces the slot's cache entry; an older
			// mapping there lives on for the handles that use it.
			gm.maps[m.key] = m
		} else {
			m = pinned[p]
		}
		m.refs++
		h.maps = append(h.maps, m)
	}
	tr.mark("handle")
	gm.refs++
	g.rendezvoused = true // only now: a failed rendezvous leaves the pad size open
	succeeded = true
	gm.mu.Unlock()

	// 5. NCCL's view of the peers' windows (NCCL >= 2.29): a collective
	// check whose failure releases the handle on every rank.
	if win != nil {
		h.window, h.windowOffset = win, ptr-info.Segment.Addr
		if err := g.checkPeerPointers(h, win.win.Load(), info.Addr-info.Segment.Addr); err != nil {
			h.Release()
			return nil, err
		}
		tr.mark("nccl-peer-check")
	}
	return h, nil
}

// dropStalePeerPads: when the ranks' pads differ in size or in whether they
// were exchanged (a rank set another pad size, which replaced its pad), every
// rank unmaps its mappings of the peers' pads, so that the next rendezvous
// exchanges the pads again on every rank (a failed rendezvous does not fix
// the group's pads for good). Every rank decides it from the same records.
func (g *Group) dropStalePeerPads(recs []blockRecord) {
	same := true
	for r := range recs {
		same = same && recs[r].padSize == recs[0].padSize && recs[r].padsReady == recs[0].padsReady
	}
	if same {
		return
	}
	gm := g.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	if p := gm.pads; p != nil && p.ready {
		// The error of the rendezvous is the one reported; a failure here
		// leaves the peers' pads mapped (syncThen), and ready false.
		gm.syncThen("the peers' signal pads", func() error { return gm.dropPeerPads(p) })
		p.ready = false
	}
}

// verdict checks the gathered records; every rank computes the same result.
func (g *Group) verdict(recs []blockRecord) error {
	world := g.world
	sts := make([]status, world)
	for r := range recs {
		sts[r] = recs[r].status
	}
	if err := firstFailure(g.name, "rendezvous", sts); err != nil {
		return err
	}
	if d := byValue(world, func(r int) string { return fmt.Sprintf("%d bytes", recs[r].padSize) }); d != "" {
		return core.Errorf(core.ErrMismatch, "group %q: rendezvous: the signal pad sizes differ (%s): set the same size on every rank before the first rendezvous", g.name, d)
	}
	if d := byValue(world, func(r int) string { return fmt.Sprint(recs[r].padsReady) }); d != "" {
		return core.Errorf(core.ErrInternal, "group %q: rendezvous: the ranks disagree on whether the signal pads were exchanged (%s)", g.name, d)
	}
	// Blocks are compared, not requests: requests that round to the same
	// block are symmetric.
	if d := byValue(world, func(r int) string { return fmt.Sprintf("block of %d bytes", recs[r].blockSize) }); d != "" {
		req := make([]string, world)
		for r := range req {
			req[r] = fmt.Sprintf("rank %d: %d", r, recs[r].requested)
		}
		return core.Errorf(core.ErrMismatch, "group %q: rendezvous on blocks of different sizes: %s; every rank must pass an allocation of the same size (bytes requested: %s)",
			g.name, d, strings.Join(req, ", "))
	}
	placement := func(r int) string {
		return fmt.Sprintf("rank %d: %d allocs, %d frees", r, recs[r].allocs, recs[r].frees)
	}
	if d := byValue(world, func(r int) string { return fmt.Sprintf("heap offset %#x", recs[r].heapOff) }); d != "" {
		counters := make([]string, world)
		for r := range counters {
			counters[r] = placement(r)
		}
		return core.Errorf(core.ErrMismatch, "group %q: rendezvous on blocks at different heap offsets (%s): placement diverged; every rank must make the same allocations and frees, in the same order, before a rendezvous. Allocator counters: %s",
			g.name, d, strings.Join(counters, "; "))
	}
	if d := byValue(world, func(r int) string {
		return fmt.Sprintf("segment at heap offset %#x of %d bytes", recs[r].segHeapOff, recs[r].segSize)
	}); d != "" {
		return core.Errorf(core.ErrMismatch, "group %q: rendezvous: the blocks lie in different segments (%s): placement diverged", g.name, d)
	}
	if d := byValue(world, func(r int) string { return fmt.Sprintf("offset %d", recs[r].offset) }); d != "" {
		return core.Errorf(core.ErrMismatch, "group %q: rendezvous on pointers at different offsets in their blocks (%s): every rank must pass the same offset into its block", g.name, d)
	}
	return nil
}

// exchange passes the descriptors that some rank lacks (the peers' pads on
// the first rendezvous, and segments not yet held), maps what arrives, and
// all-gathers the outcome. On failure every rank undoes what it mapped.
//
// prepare, if set, runs once what arrived is mapped and before the final
// verdict (gm.mu held): its failure is this rank's failure, shared with all.
func (g *Group) exchange(info alloc.BlockInfo, recs []blockRecord, needPads bool, need func(r, p int) bool, fresh []*peerMap, prepare func() error, tr *phaseTrace) error {
	gm := g.gm
	world, me := g.world, g.rank
	var localErr error
	note := func(err error) {
		if localErr == nil && err != nil {
			localErr = core.Errorf(core.CodeOf(err), "rank %d: %v", me, err)
		}
	}
	padFD, segFD := -1, -1
	if needPads && len(g.sock) > 1 {
		var err error
		padFD, err = gm.be.Export(gm.pads.own)
		note(err)
	}
	sendSeg := false
	for r := 0; r < world; r++ {
		sendSeg = sendSeg || (need(r, me) && g.bySocket(r))
	}
	if sendSeg {
		var err error
		segFD, err = g.alloc.ExportSegment(info.Segment.Addr)
		note(err)
	}
	tr.mark("export")
	out := make([][]int, world)
	for dst := 0; dst < world; dst++ {
		if dst == me || !g.bySocket(dst) {
			continue
		}
		if needPads && padFD >= 0 {
			out[dst] = append(out[dst], padFD)
		}
		if need(dst, me) && segFD >= 0 {
			out[dst] = append(out[dst], segFD)
		}
	}
	in, err := g.allToAllFDs(out)
	for _, fd := range []int{padFD, segFD} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	var fdErr error
	if err != nil {
		if g.localRank == 0 || !ipc.IsLocalShortage(err) {
			return err // the team's rank 0 has told every rank (or every rank saw it)
		}
		// This rank alone ran out of descriptors receiving: the others
		// succeeded and wait in the verdict below. Join it with the
		// failure, so that every rank is told which rank failed and why.
		fdErr = err
		note(err)
		in = make([][]int, world)
	}

	tr.mark("send-fds")
	// Map what arrived. The backend owns each descriptor from Import on;
	// the ones we do not get to are closed here.
	gm.mu.Lock()
	p := gm.pads
	for src := 0; src < world; src++ {
		fds := in[src]
		if src == me || !g.bySocket(src) {
			continue
		}
		want := 0
		if needPads {
			want++
		}
		if need(me, src) {
			want++
		}
		if len(fds) != want || localErr != nil {
			if localErr == nil {
				note(core.Errorf(core.ErrPeer, "%s sent %d descriptors, %d were expected (it could not export its memory)", g.who(src), len(fds), want))
			}
			for _, fd := range fds {
				unix.Close(fd)
			}
			continue
		}
		if needPads {
			addr, mem, err := gm.importMap(fds[0], p.phys, g.who(src)+"'s signal pad")
			fds = fds[1:]
			if err != nil {
				note(fmt.Errorf("mapping %s's signal pad: %w", g.who(src), err))
				for _, fd := range fds {
					unix.Close(fd)
				}
				continue
			}
			p.addr[src], p.mem[src] = addr, mem
		}
		if need(me, src) {
			size := uintptr(recs[src].segSize)
			addr, mem, err := gm.importMap(fds[0], size, fmt.Sprintf("%s's segment at heap offset %#x", g.who(src), info.Segment.HeapOff))
			if err != nil {
				note(fmt.Errorf("mapping %s's segment of %d bytes: %w", g.who(src), size, err))
				continue
			}
			fresh[src] = &peerMap{key: mapKey{src, info.Segment.HeapOff}, id: recs[src].segID, addr: addr, size: size, mem: mem}
		}
	}
	gm.mu.Unlock()
	if g.fabricSpan {
		note(g.exchangeFabric(info, recs, needPads, need, fresh, localErr))
		tr.mark("fabric")
	}
	gm.mu.Lock()
	if localErr == nil && prepare != nil {
		note(prepare())
	}
	gm.mu.Unlock()
	tr.mark("import+map")

	// Everyone succeeds or everyone undoes.
	raw, err := g.ex.AllGather(0, encodeStatus(statusOf(localErr)))
	if err != nil && fdErr != nil {
		err = fdErr // the verdict could not be shared (records on the broken channel): ours is the cause
	}
	if err == nil {
		err = g.verdictOf("rendezvous (mapping peers' memory)", raw)
	}
	if err != nil {
		gm.mu.Lock()
		for i, m := range fresh {
			if m != nil {
				gm.unmapRelease(m.addr, m.size, m.mem)
				fresh[i] = nil
			}
		}
		if needPads {
			gm.dropPeerPads(p)
		}
		gm.mu.Unlock()
		return err
	}
	return nil
}
