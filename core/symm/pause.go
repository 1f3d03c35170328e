package symm

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
)

// Note [Collective pause]
//
// A segment that a rendezvous exported is held by every peer that imported
// it: pausing it in one process would not return its memory. Group.Pause is
// therefore collective, and in two phases (DESIGN, "Two phases for every
// collective state change"): every rank
//
//  1. lists the tag's segments (heap offset, size, ID) and all-gathers the
//     list; every rank checks the same things (the tag is live everywhere,
//     the lists agree) and fails alike before anything is done;
//  2. prepares what can fail: waits for the device and makes the tag's host
//     copies (alloc.PausePrepare), releasing nothing, and all-gathers its
//     outcome: a failure anywhere (host memory or disk for a copy, a failed
//     synchronisation) fails every rank with everything still live, mapped
//     and usable, and the next pause starts afresh;
//  3. only then unmaps and releases its imports of the peers' segments of
//     the list, keeping their address ranges reserved (handles point
//     there), and releases its own (alloc.PauseCommit, with the copies of
//     step 2), and all-gathers the outcome.
//
// What can still fail in step 3 is the driver refusing an unmap or a
// release, or the communicator refusing to deregister an NCCL window: an
// import whose unmap fails stays mapped and is not marked paused (the
// resume drops it); one whose release fails is paused and its memory
// leaked. Our own segments are released one by one, each segment's window
// deregistered immediately before its unmap (Note [Releasing a paused
// tag] in core/alloc), so a failure stops with the segments after it still
// mapped and still holding their windows; a window whose deregistration
// fails stays registered on its mapped segment. Either way the tag counts
// as paused on every rank, in part on the failing one, and every rank gets
// the failure with what the failing rank holds. What the ranks see then:
//
//   - Handle.Window: the window on a segment still mapped with it;
//     ErrInvalidState "paused" on a released one; on a segment whose unmap
//     failed after its window went (mapped, no window: the one state a
//     live segment can be in without its window), ErrInvalidState naming
//     that state and the resume.
//   - Group.Pause again: ErrInvalidState on every rank (already paused;
//     "in part" on the failing rank), changing nothing.
//   - Group.Resume: the way back. Every rank lists every segment of its
//     paused tag, so the lists agree; each takes back what it released and
//     leaves what is still mapped; the peers' imports are mapped again from
//     descriptors of whatever memory each segment has now; and every window
//     that any rank deregistered is registered again on every rank, a rank
//     that kept the old one deregistering it once the new one is there
//     (the window is collective, and its peers' parts are gone). After it
//     the group is resumed everywhere with one window per segment, and a
//     pause may be tried again.
//
// Group.Resume mirrors it: the lists are checked (the tag is paused
// everywhere), every rank resumes its own tag (a rank that fails, e.g. out
// of memory, makes every rank pause again: all stay paused), then the ranks
// pass descriptors of the new memory over the group's IPC channel for every
// import that a pause dropped, map them at the same addresses, and
// all-gather the outcome; on failure every rank unmaps what it remapped and
// pauses its tag again. Handles keep their pointers throughout. Signal pads
// belong to the group, never to a tag, and are never paused.
//
// A peer that fails or dies during steps 1 and 2 leaves everything as it
// was (the others get its error or ErrPeer/ErrTimeout within the group's
// timeout). During step 3 the ranks that got there have released their
// part: their tag is paused and Group.Resume cannot run with a dead peer,
// but a local Allocator.Resume takes the memory back for this process alone.

const recPause = 4 // at a collective pause or resume: the tag's segments

// tagRecord is what a rank all-gathers at a collective pause or resume.
type tagRecord struct {
	status status
	segs   []alloc.SegmentInfo // the tag's segments, in heap order (Addr unused)
	// held lists (peer, heap offset) of the peers' segments this rank has
	// paused imports of (resume only): where it needs a descriptor.
	held []mapKey
	// wins lists the heap offsets of the tag's segments whose NCCL window
	// the pause deregistered (resume only): registered again, collectively.
	wins []uint64
}

func (t *tagRecord) encode() []byte {
	var w writer
	w.header(recPause, t.status)
	w.u32(uint32(len(t.segs)))
	for _, s := range t.segs {
		w.u64(s.HeapOff)
		w.u64(uint64(s.Size))
		w.u64(s.ID)
	}
	w.u32(uint32(len(t.held)))
	for _, k := range t.held {
		w.u32(uint32(k.peer))
		w.u64(k.heapOff)
	}
	w.u32(uint32(len(t.wins)))
	for _, off := range t.wins {
		w.u64(off)
	}
	return w.b
}

func decodeTag(p []byte, world int) (t tagRecord, err error) {
	r := reader{b: p}
	t.status = r.header(recPause)
	n := int(r.u32())
	if n > len(p)/24 {
		return t, errShort
	}
	for i := 0; i < n && r.err == nil; i++ {
		t.segs = append(t.segs, alloc.SegmentInfo{HeapOff: r.u64(), Size: uintptr(r.u64()), ID: r.u64()})
	}
	n = int(r.u32())
	if n > len(p)/12 {
		return t, errShort
	}
	for i := 0; i < n && r.err == nil; i++ {
		k := mapKey{peer: int(r.u32()), heapOff: r.u64()}
		if k.peer < 0 || k.peer >= world {
			return t, fmt.Errorf("peer %d out of range", k.peer)
		}
		t.held = append(t.held, k)
	}
	n = int(r.u32())
	if n > len(p)/8 {
		return t, errShort
	}
	for i := 0; i < n && r.err == nil; i++ {
		t.wins = append(t.wins, r.u64())
	}
	return t, r.err
}

func tagWhat(tag string) string {
	if tag == "" {
		return "every tag"
	}
	return fmt.Sprintf("tag %q", tag)
}

// tagCall is what one collective pause or resume holds (Note [Pause
// phases], Note [Resume phases]): the group, the tag, the words that name
// the call in messages, our segments of the tag, this rank's failure for
// the next verdict, and the records.
type tagCall struct {
	g         *Group
	gm        *groupMem
	tag, what string
	// choice is tag resolved, once, by listSegments: the later phases
	// hand it to the allocator as it is.
	choice alloc.TagChoice

	segs     []alloc.SegmentInfo // our segments of the tag, in heap order
	localErr error               // this rank's failure, for the next verdict
	rec      tagRecord
	recs     []tagRecord
}

// gather all-gathers c.rec and keeps every rank's, failing alike on every
// rank on a local failure or segment lists that differ.
func (c *tagCall) gather() error {
	g, what := c.g, c.what
	raw, err := g.ex.AllGather(0, c.rec.encode())
	if err != nil {
		return err
	}
	recs := make([]tagRecord, g.world)
	sts := make([]status, g.world)
	for r := range raw {
		if recs[r], err = decodeTag(raw[r], g.world); err != nil {
			return core.Errorf(core.ErrPeer, "group %q: %s: rank %d sent a malformed record: %v", g.name, what, r, err)
		}
		sts[r] = recs[r].status
	}
	if err := firstFailure(g.name, what, sts); err != nil {
		return err
	}
	layout := func(r int) string {
		s := fmt.Sprintf("%d segments", len(recs[r].segs))
		for _, seg := range recs[r].segs {
			s += fmt.Sprintf(" %#x+%d", seg.HeapOff, seg.Size)
		}
		return s
	}
	if d := core.RanksByValue(g.world, layout); d != "" {
		return core.Errorf(core.ErrMismatch, "group %q: %s: the ranks' segments differ (%s): placement diverged, or the tag holds different allocations on different ranks", g.name, what, d)
	}
	c.recs = recs
	return nil
}

// listSegments puts our segments of the tag (paused ones for a resume)
// and this rank's failure to list them in c.rec.
func (c *tagCall) listSegments(paused bool) {
	c.choice, c.localErr = alloc.ChooseTag(c.tag)
	if c.localErr == nil {
		c.segs, c.localErr = c.g.alloc.ChosenSegments(c.choice, paused)
	}
	if c.localErr != nil {
		c.localErr = core.Errorf(core.CodeOf(c.localErr), "rank %d: %v", c.g.rank, c.localErr)
	}
	c.rec.status, c.rec.segs = statusOf(c.localErr), c.segs
}

// repause undoes this rank's part of a failed collective resume. Its own
// error is dropped: the collective's error is the one reported, and a
// pause after a resume in the same call has no new way to fail but the
// device's (then the memory stays mapped, which is safe).
func (c *tagCall) repause() {
	_, _ = c.g.alloc.PauseChosen(c.choice, alloc.PauseOptions{Collective: true})
}

// Pause releases the memory of tag ("" = every live tag of the group's
// device) on every rank, imports by peers included (Note [Collective pause]).
// Collective.
func (g *Group) Pause(tag string) error {
	g.coll.Lock()
	defer g.coll.Unlock()
	what := "pause of " + tagWhat(tag)
	if err := g.usable(what); err != nil {
		return err
	}
	c := &pauseCall{tagCall: tagCall{g: g, gm: g.gm, tag: tag, what: what}}
	return g.settle(what, c.run())
}

// Note [Pause phases]
//
// A collective pause (g.coll held, the group usable) is one pauseCall that
// runs the steps of Note [Collective pause] as these phases, in order; a
// phase that returns an error ends the call.
//
//	list            our live segments of the tag; a failure is kept for
//	                the record. Leaves nothing.
//	gather          step 1: one all-gather of the lists, checked alike on
//	                every rank (tagCall.gather). Leaves nothing.
//	prepare         step 2: the device's work and the host copies
//	                (alloc.PausePrepare), releasing nothing, and the
//	                outcome shared. Leaves the copies to the allocator (the
//	                next pause starts afresh).
//	releaseImports  step 3: our imports of the peers' segments
//	                of the lists are unmapped and released, their ranges
//	                kept. Nothing to undo: a failure is reported, what it
//	                left is described in Note [Collective pause].
//	releaseOwn      step 3: our own memory (alloc.PauseCommit), each
//	                segment's NCCL window deregistered right before its
//	                unmap and remembered for the resume, and the outcome
//	                shared. Nothing to undo: a failure leaves the tag
//	                paused, in part, and its error names the resume as the
//	                way back (Note [Collective pause]).
type pauseCall struct {
	tagCall
}

// run is the driver of Note [Pause phases].
func (c *pauseCall) run() error {
	c.listSegments(false)
	if err := c.gather(); err != nil {
		return err
	}
	if err := c.prepare(); err != nil {
		return err
	}
	c.releaseImports()
	return c.releaseOwn()
}

// prepare does what can fail (the device's work, the host copies),
// releasing nothing; every rank learns whether every rank is ready.
func (c *pauseCall) prepare() error {
	g := c.g
	if _, err := g.alloc.PauseChosen(c.choice, alloc.PauseOptions{Collective: true, Stage: alloc.PausePrepare}); err != nil {
		c.localErr = core.Errorf(core.CodeOf(err), "rank %d: %v", g.rank, err)
	}
	return g.shareVerdict(c.what+" (waiting for the device, host copies; nothing was released)", c.localErr)
}

// releaseImports unmaps and releases our imports of the peers' segments
// of the lists.
func (c *pauseCall) releaseImports() {
	segs := make([][]alloc.SegmentInfo, len(c.recs))
	for p := range c.recs {
		segs[p] = c.recs[p].segs
	}
	if err := c.gm.peers.pauseImports(segs); err != nil && c.localErr == nil {
		c.localErr = err
	}
}

// releaseOwn releases our own memory of the tag and shares the outcome;
// a failure anywhere names the way back (Note [Pause phases]).
func (c *pauseCall) releaseOwn() error {
	g := c.g
	// Each segment's window goes immediately before its memory does (Note
	// [Window registration]); the resume registers them again.
	err := g.wins.pause(c.segs, func() error {
		_, err := g.alloc.PauseChosen(c.choice, alloc.PauseOptions{Collective: true, Stage: alloc.PauseCommit})
		return err
	})
	switch {
	case err != nil && c.localErr == nil:
		c.localErr = core.Errorf(core.CodeOf(err), "rank %d: %v", g.rank, err)
	case err != nil: // after a failure of releaseImports: both are told
		c.localErr = core.Errorf(core.CodeOf(c.localErr), "%v; and releasing its own memory: %v", c.localErr, err)
	}
	what := c.what + " (releasing memory)"
	raw, err := g.ex.AllGather(0, encodeStatus(statusOf(c.localErr)))
	if err != nil {
		return err
	}
	if err := g.verdictOf(what, raw); err != nil {
		return core.Errorf(core.CodeOf(err), "%v; %s is now paused on every rank, in part where a rank said so above: the group's resume, on every rank, takes every rank back to the resumed state (its windows registered again), and the pause may then be tried again (a pause before that resume is ErrInvalidState: already paused)", err, tagWhat(c.tag))
	}
	return nil
}

// Resume takes back the memory of tag ("" = every paused tag) on every
// rank at the same addresses and maps the peers' new memory where their
// imports were dropped (Note [Collective pause]). Collective.
func (g *Group) Resume(tag string) error {
	g.coll.Lock()
	defer g.coll.Unlock()
	what := "resume of " + tagWhat(tag)
	if err := g.usable(what); err != nil {
		return err
	}
	c := &resumeCall{tagCall: tagCall{g: g, gm: g.gm, tag: tag, what: what}}
	return g.settle(what, c.run())
}

// Note [Resume phases]
//
// A collective resume (g.coll held, the group usable) is one resumeCall
// that runs these phases in order; a phase that returns an error ends the
// call after the undo it names. send and remap are socketPath's, fabric is
// fabricPath's (Note [Descriptor paths]).
//
//	list      our paused segments of the tag, the paused imports of the
//	          peers' segments we hold (an import a failed pause left
//	          mapped is dropped now), the windows a pause
//	          deregistered; a failure is kept for the record. Leaves
//	          nothing to undo (what it dropped is paused, as it should
//	          have been).
//	gather    one all-gather of the lists, checked alike on every rank
//	          (tagCall.gather). Leaves nothing.
//	takeBack  every rank resumes its own tag and shares the outcome; on
//	          a failure every rank that resumed pauses again. Leaves our
//	          memory resumed (undo: repause).
//	send      descriptors of our new memory to every peer by socket that
//	          held a paused import of it, all to all; on a failure the
//	          driver pauses our tag again. Leaves the descriptors that
//	          arrived.
//	remap     each arrived descriptor imported and mapped into
//	          its import's reserved range. Leaves remapped (undo).
//	fabric    the same for peers of our team on other machines, through
//	          fabric handles (Note [Fabric teams]). Leaves remapped (undo).
//	verdict   the outcome shared; on a failure, undo.
//	windows   the NCCL windows the pause deregistered, registered again
//	          collectively (Note [Window registration]): the memory is back
//	          everywhere, so a failure there leaves it so.
//	undo      unmaps and releases what remap and fabric mapped, marks it
//	          paused again, and pauses our tag again.
type resumeCall struct {
	tagCall
	in       [][]int    // the descriptors that arrived, by sender
	remapped []*peerMap // imports this call mapped again
}

// run is the driver of Note [Resume phases].
func (c *resumeCall) run() error {
	g, what := c.g, c.what
	c.list()
	if err := c.gather(); err != nil {
		return err
	}
	if err := c.takeBack(); err != nil {
		return err
	}
	for _, p := range g.paths {
		if err := p.resume(c); err != nil {
			return c.undo(err) // what the paths remapped, then our tag paused again
		}
	}
	if err := g.shareVerdict(what+" (mapping peers' memory)", c.localErr); err != nil {
		return c.undo(err)
	}
	// The memory is back everywhere; a failure to register a window again
	// leaves it so (the next rendezvous on the segment registers it).
	wins := make([][]uint64, len(c.recs))
	for r := range c.recs {
		wins[r] = c.recs[r].wins
	}
	return g.wins.resume(what, c.segs, wins)
}

// list fills our record: the tag's paused segments, the paused imports we
// hold, and the windows the pause deregistered.
func (c *resumeCall) list() {
	g, gm := c.g, c.gm
	c.listSegments(true)
	tagOffs := map[uint64]bool{}
	for _, s := range c.segs {
		tagOffs[s.HeapOff] = true
	}
	// A pause whose unmap of an import failed left it mapped (Note
	// [Collective pause]), on memory its peer has released: dropped now,
	// and mapped again below like the paused ones.
	held, err := gm.peers.pausedImports(tagOffs, c.localErr == nil)
	if err != nil && c.localErr == nil {
		c.localErr = err
	}
	c.rec.held = held
	c.rec.wins = g.wins.paused(c.segs)
	slices.SortFunc(c.rec.held, func(a, b mapKey) int {
		if a.peer != b.peer {
			return a.peer - b.peer
		}
		return cmp.Compare(a.heapOff, b.heapOff)
	})
}

// takeBack: every rank takes its own memory back, or all stay paused.
func (c *resumeCall) takeBack() error {
	g := c.g
	_, c.localErr = g.alloc.ResumeChosen(c.choice, alloc.ResumeOptions{})
	if c.localErr != nil {
		c.localErr = core.Errorf(core.CodeOf(c.localErr), "rank %d: %v", g.rank, c.localErr)
	}
	if err := g.shareVerdict(c.what+" (taking memory back)", c.localErr); err != nil {
		if c.localErr == nil {
			c.repause()
		}
		return err
	}
	return nil
}

// need(r, p, s): rank r held a paused import of peer p's segment s.
func (c *resumeCall) need(r, p int, s alloc.SegmentInfo) bool {
	return r != p && slices.Contains(c.recs[r].held, mapKey{p, s.HeapOff})
}

// undo undoes this rank's part of the resume: the peers mapped again are
// unmapped, its own memory paused again. It returns err.
func (c *resumeCall) undo(err error) error {
	c.gm.peers.repause(c.remapped)
	c.repause()
	return err
}
