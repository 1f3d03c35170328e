package symm

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
)

// fabricPath (Note [Descriptor paths]): fabric handles through the
// group's all-gather.

// exchange: the phase fabric of Note [Descriptor exchange phases]; this
// rank's failure goes to the verdict.
func (fabricPath) exchange(x *exchangeCall) error {
	x.note(x.exchangeFabric())
	x.tr.mark("fabric")
	return nil
}

// resume: the phase fabric of Note [Resume phases]; its error is the
// all-gather's.
func (fabricPath) resume(c *resumeCall) error {
	return c.fabric()
}

// exchangeFabric is the fabric phase of an exchangeCall (Note [Descriptor
// exchange phases]), between the machines of a team: the pads (needPads)
// and the segment of the rendezvous where a peer of the team on another
// machine lacks it travel as fabric handles through the all-gather, and
// are mapped into the pads and fresh like descriptors. Collective where
// g.fabricSpan; it returns this rank's failure.
func (x *exchangeCall) exchangeFabric() error {
	g, info, recs, needPads, need, fresh, localErr := x.g, x.info, x.recs, x.needPads, x.need, x.fresh, x.localErr
	me := g.rank
	exportPad := false
	segs := map[uint64]uintptr{}
	for r := 0; r < g.world; r++ {
		if !g.crossTeam(me, r) {
			continue
		}
		exportPad = exportPad || needPads
		if need(r, me) {
			segs[info.Segment.HeapOff] = info.Segment.Addr
		}
	}
	frs, err := g.fabricGather(localErr, exportPad, segs)
	if err != nil {
		return err
	}
	if localErr != nil {
		return nil // ours is the failure the verdict reports
	}
	gm := g.gm
	p := gm.pads.current()
	for src := 0; src < g.world; src++ {
		if !g.crossTeam(me, src) {
			continue
		}
		f := frs[src]
		if f.status.code != core.Success {
			return core.Errorf(core.ErrPeer, "%s could not send its fabric handles: %s", g.who(src), f.status.msg)
		}
		if needPads {
			if len(f.pad) == 0 {
				return core.Errorf(core.ErrPeer, "%s sent no fabric handle for its signal pad", g.who(src))
			}
			addr, mem, err := gm.importMapFabric(f.pad, p.phys, g.who(src)+"'s signal pad (fabric handle)")
			if err != nil {
				return fmt.Errorf("mapping %s's signal pad through its fabric handle: %w", g.who(src), err)
			}
			gm.pads.mapPeer(src, addr, mem)
		}
		if need(me, src) {
			h := f.segs[info.Segment.HeapOff]
			if len(h) == 0 {
				return core.Errorf(core.ErrPeer, "%s sent no fabric handle for its segment at heap offset %#x", g.who(src), info.Segment.HeapOff)
			}
			size := uintptr(recs[src].segSize)
			addr, mem, err := gm.importMapFabric(h, size, fmt.Sprintf("%s's segment at heap offset %#x (fabric handle)", g.who(src), info.Segment.HeapOff))
			if err != nil {
				return fmt.Errorf("mapping %s's segment of %d bytes through its fabric handle: %w", g.who(src), size, err)
			}
			fresh[src] = &peerMap{key: mapKey{src, info.Segment.HeapOff}, id: recs[src].segID, addr: addr, size: size, mem: mem}
		}
	}
	return nil
}

// fabric maps again, through fabric handles in the all-gather, the imports
// of peers of our team on other machines (Note [Fabric teams]): our
// segments that such a peer held travel as handles. Its error is the
// all-gather's, this rank's failure goes to c.localErr.
func (c *resumeCall) fabric() error {
	g, gm, me := c.g, c.gm, c.g.rank
	segs := map[uint64]uintptr{}
	for _, s := range c.segs {
		for dst := 0; dst < g.world; dst++ {
			if c.need(dst, me, s) && !g.bySocket(dst) {
				segs[s.HeapOff] = s.Addr
			}
		}
	}
	frs, err := g.fabricGather(c.localErr, false, segs)
	if err != nil {
		return err
	}
	for src := 0; src < g.world && c.localErr == nil; src++ {
		if !g.crossTeam(me, src) {
			continue
		}
		if frs[src].status.code != core.Success {
			c.localErr = core.Errorf(core.ErrPeer, "rank %d: rank %d could not send its fabric handles: %s", me, src, frs[src].status.msg)
			break
		}
		for _, s := range c.recs[src].segs {
			if !c.need(me, src, s) {
				continue
			}
			m := gm.peers.lookup(mapKey{src, s.HeapOff})
			h := frs[src].segs[s.HeapOff]
			var err error = core.Errorf(core.ErrPeer, "no fabric handle arrived")
			if fb, ok := g.be.(fabricBackend); ok && len(h) > 0 {
				var mem core.Memory
				if mem, err = fb.ImportFabric(g.device, h); err == nil {
					err = gm.peers.remap(m, mem)
				}
			}
			if err != nil {
				c.localErr = core.Errorf(core.CodeOf(err), "rank %d: mapping rank %d's segment at heap offset %#x again through its fabric handle: %v", me, src, s.HeapOff, err)
				break
			}
			c.remapped = append(c.remapped, m)
		}
	}
	return nil
}
