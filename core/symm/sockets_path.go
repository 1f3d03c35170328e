package symm

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/ipc"
	"golang.org/x/sys/unix"
)

// socketPath (Note [Descriptor paths]): descriptors over Unix sockets.

// exchange: the phases export, send and mapArrived of Note [Descriptor
// exchange phases]; a failure of send that every rank saw ends the call.
func (socketPath) exchange(x *exchangeCall) error {
	x.export()
	if err := x.send(); err != nil {
		return err
	}
	x.mapArrived()
	return nil
}

// resume: the phases send and remap of Note [Resume phases]; a failure of
// send ends the call (nothing is remapped yet).
func (socketPath) resume(c *resumeCall) error {
	if err := c.send(); err != nil {
		return err
	}
	c.remap()
	return nil
}

// export makes the descriptors of our pad and segment that some rank by
// socket needs.
func (x *exchangeCall) export() {
	g, me := x.g, x.g.rank
	x.padFD, x.segFD = -1, -1
	if x.needPads && len(g.sock) > 1 {
		var err error
		x.padFD, err = x.gm.be.Export(x.gm.pads.current().own)
		x.note(err)
	}
	sendSeg := false
	for r := 0; r < g.world; r++ {
		sendSeg = sendSeg || (x.need(r, me) && g.bySocket(r))
	}
	if sendSeg {
		var err error
		x.segFD, err = g.alloc.ExportSegment(x.info.Segment.Addr)
		x.note(err)
	}
	x.tr.mark("export")
}

// send passes the descriptors, all to all, and closes ours.
func (x *exchangeCall) send() error {
	g, me := x.g, x.g.rank
	out := make([][]int, g.world)
	for dst := 0; dst < g.world; dst++ {
		if dst == me || !g.bySocket(dst) {
			continue
		}
		if x.needPads && x.padFD >= 0 {
			out[dst] = append(out[dst], x.padFD)
		}
		if x.need(dst, me) && x.segFD >= 0 {
			out[dst] = append(out[dst], x.segFD)
		}
	}
	in, err := g.allToAllFDs(out)
	for _, fd := range []int{x.padFD, x.segFD} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	x.in = in
	if err != nil {
		if g.localRank == 0 || !ipc.IsLocalShortage(err) {
			return err // the team's rank 0 has told every rank (or every rank saw it)
		}
		// This rank alone ran out of descriptors receiving: the others
		// succeeded and wait in the verdict below. Join it with the
		// failure, so that every rank is told which rank failed and why.
		x.fdErr = err
		x.note(err)
		x.in = make([][]int, g.world)
	}
	x.tr.mark("send-fds")
	return nil
}

// mapArrived maps what arrived. The backend owns each descriptor from
// Import on; the ones we do not get to are closed here.
func (x *exchangeCall) mapArrived() {
	g := x.g
	for src := 0; src < g.world; src++ {
		if src == g.rank || !g.bySocket(src) {
			continue
		}
		x.mapFrom(src, x.in[src])
	}
}

// mapFrom imports and maps the descriptors fds that src sent.
func (x *exchangeCall) mapFrom(src int, fds []int) {
	g, gm := x.g, x.gm
	want := 0
	if x.needPads {
		want++
	}
	if x.need(g.rank, src) {
		want++
	}
	if len(fds) != want || x.localErr != nil {
		if x.localErr == nil {
			x.note(core.Errorf(core.ErrPeer, "%s sent %d descriptors, %d were expected (it could not export its memory)", g.who(src), len(fds), want))
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		return
	}
	if x.needPads {
		addr, mem, err := gm.importMap(fds[0], gm.pads.current().phys, g.who(src)+"'s signal pad")
		fds = fds[1:]
		if err != nil {
			x.note(fmt.Errorf("mapping %s's signal pad: %w", g.who(src), err))
			for _, fd := range fds {
				unix.Close(fd)
			}
			return
		}
		gm.pads.mapPeer(src, addr, mem)
	}
	if x.need(g.rank, src) {
		off := x.info.Segment.HeapOff
		size := uintptr(x.recs[src].segSize)
		addr, mem, err := gm.importMap(fds[0], size, fmt.Sprintf("%s's segment at heap offset %#x", g.who(src), off))
		if err != nil {
			x.note(fmt.Errorf("mapping %s's segment of %d bytes: %w", g.who(src), size, err))
			return
		}
		x.fresh[src] = &peerMap{key: mapKey{src, off}, id: x.recs[src].segID, addr: addr, size: size, mem: mem}
	}
}

// send passes descriptors of our segments to the peers by socket that need
// them, all to all.
func (c *resumeCall) send() error {
	g, me := c.g, c.g.rank
	fds := make([]int, len(c.segs))
	for i := range fds {
		fds[i] = -1
	}
	out := make([][]int, g.world)
	for i, s := range c.segs {
		for dst := 0; dst < g.world; dst++ {
			if !c.need(dst, me, s) {
				continue
			}
			if !g.bySocket(dst) {
				continue // fabricPath's
			}
			if fds[i] < 0 {
				fd, err := g.alloc.ExportSegment(s.Addr)
				if err != nil {
					if c.localErr == nil {
						c.localErr = core.Errorf(core.CodeOf(err), "rank %d: exporting its segment at heap offset %#x: %v", me, s.HeapOff, err)
					}
					break
				}
				fds[i] = fd
			}
			out[dst] = append(out[dst], fds[i])
		}
	}
	in, err := g.allToAllFDs(out)
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	c.in = in
	return err
}

// remap maps the descriptors that arrived into the paused imports' ranges.
func (c *resumeCall) remap() {
	g := c.g
	for src := 0; src < g.world; src++ {
		if src == g.rank || !g.bySocket(src) {
			continue
		}
		c.remapFrom(src, c.in[src])
	}
}

// remapFrom maps the descriptors got that src sent.
func (c *resumeCall) remapFrom(src int, got []int) {
	g, gm, me := c.g, c.gm, c.g.rank
	var want []*peerMap
	for _, s := range c.recs[src].segs {
		if c.need(me, src, s) {
			want = append(want, gm.peers.lookup(mapKey{src, s.HeapOff}))
		}
	}
	if len(got) != len(want) || c.localErr != nil {
		if c.localErr == nil {
			c.localErr = core.Errorf(core.ErrPeer, "rank %d: rank %d sent %d descriptors, %d were expected (it could not export its memory)", me, src, len(got), len(want))
		}
		for _, fd := range got {
			unix.Close(fd)
		}
		return
	}
	for i, m := range want {
		mem, err := g.be.Import(g.device, got[i])
		if err == nil {
			err = gm.peers.remap(m, mem)
		}
		if err != nil {
			if c.localErr == nil {
				c.localErr = core.Errorf(core.CodeOf(err), "rank %d: mapping rank %d's segment at heap offset %#x again: %v", me, src, m.key.heapOff, err)
			}
			for _, fd := range got[i+1:] {
				unix.Close(fd)
			}
			return
		}
		c.remapped = append(c.remapped, m)
	}
}

// allToAllFDs passes descriptors inside the socket team: out[r] goes to
// rank r (only ranks bySocket may have any), and in[r] came from rank r
// (nil for the others). The channel numbers the socket team's ranks
// 0..size-1.
func (g *Group) allToAllFDs(out [][]int) ([][]int, error) {
	lout := make([][]int, len(g.sock))
	idx := make(map[int]int, len(g.sock))
	for i, r := range g.sock {
		idx[r] = i
	}
	for r, fds := range out {
		if len(fds) == 0 {
			continue
		}
		i, ok := idx[r]
		if !ok {
			return nil, core.Errorf(core.ErrInternal, "group %q: descriptors for rank %d, which is not on this machine's sockets", g.name, r)
		}
		lout[i] = fds
	}
	lin, err := g.ch.AllToAllFDs(0, lout)
	if err != nil {
		return nil, err
	}
	in := make([][]int, g.world)
	for i, fds := range lin {
		in[g.sock[i]] = fds
	}
	return in, nil
}
