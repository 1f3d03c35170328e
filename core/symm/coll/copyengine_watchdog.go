package coll

// The copy-engine calls' shared state of one group and channel: the
// scratch and the watchdog (Note [Copy-engine collectives] in
// copyengine.go).

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/lockrank"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// ceState is what the copy-engine calls of one (group, channel) share on
// a stream backend: the scratch and the watchdog (Note [Copy-engine
// collectives]). Keyed by this rank's pad and the channel: calls on one
// channel of one group are ordered (one stream, or streams the caller
// orders), so one scratch serves them.
type ceState struct {
	mu lockrank.Mutex[lockrank.CopyEngine] // guards every field below, and orders enqueueing
	// scratch is device memory of scratchBytes (0: none yet), mapped at
	// scratch; it only grows (a captured graph may read the old one).
	scratch, scratchBytes uintptr
	// done is the pinned host word that each eager call's last stream
	// operation stores its number seq into; hostWords more pinned words
	// follow it, where the watchdog reads the flags into (0: the backend
	// has no pinned memory, no watchdog).
	done    uintptr
	seq     uint32
	pending []ceCall
	timer   *time.Timer
	timerAt time.Time
	// fail is set while the watchdog drains the stream after giving up a
	// call on failChannel.
	fail        *ceFailure
	failChannel int
	failDigest  uint32 // the argument digest of the call given up
}

// ceCall is an eager call the watchdog waits for.
type ceCall struct {
	seq     uint32
	at      time.Time
	digest  uint32
	channel int
	l       local
}

type ceKey struct {
	device  int
	pad     uintptr
	channel int
}

var (
	ceStatesMu sync.Mutex
	ceStates   = map[ceKey]*ceState{}
)

// ceHostWords is the pinned words of a state: the completion word, then
// room for every flag of a channel (core.CopyEnginePhases * world).
func ceHostWords(world int) uintptr { return uintptr(4 * (1 + core.CopyEnginePhases*world)) }

// ceStateFor is the state of the view's (group, channel) on device.
func ceStateFor(l local, device, channel int) (*ceState, error) {
	k := ceKey{device, l.pads[l.rank], channel}
	ceStatesMu.Lock()
	defer ceStatesMu.Unlock()
	if st := ceStates[k]; st != nil {
		return st, nil
	}
	st := &ceState{}
	be := l.h.Backend
	if hm, ok := be.(core.HostMemory); ok {
		addr, err := hm.AllocHost(device, ceHostWords(l.world))
		if err != nil {
			return nil, core.Errorf(core.CodeOf(err), "group %q: the copy engines' completion word: %v", l.h.GroupName, err)
		}
		clear(bytesAt(addr, ceHostWords(l.world)))
		st.done = addr
	}
	ceStates[k] = st
	return st, nil
}

// ensureScratch makes the scratch at least n bytes: new device memory
// (reserved, created and mapped by the backend) when it is smaller. The
// old one stays mapped (Note [Copy-engine collectives]).
func (st *ceState) ensureScratch(be core.Backend, device int, n uintptr) error {
	if st.scratchBytes >= n {
		return nil
	}
	g, err := be.Granularity(device)
	if err != nil {
		return err
	}
	size := (n + g - 1) / g * g
	addr, err := be.Reserve(device, size)
	if err != nil {
		return err
	}
	m, err := be.Create(device, size)
	if err != nil {
		be.Unreserve(device, addr, size)
		return err
	}
	if om, ok := be.(core.OwnDeviceMapper); ok {
		err = om.MapOwnDevice(device, addr, size, m)
	} else {
		err = be.Map(device, addr, size, m)
	}
	if err != nil {
		be.Release(m)
		be.Unreserve(device, addr, size)
		return err
	}
	st.scratch, st.scratchBytes = addr, size
	return nil
}

// watch adds eager call seq to the watchdog's calls and arms its timer
// (st.mu held).
func (st *ceState) watch(l local, c *core.Collective, seq uint32) {
	st.trim()
	now := time.Now()
	// The call's target is a value on its caller's stack (Run): the
	// watchdog keeps a copy of its own, so that no collective's target
	// moves to the heap for the copy-engine calls' sake.
	kept := new(target)
	*kept = *l.h
	// (Its slices are copied too: Go's escape analysis does not tell a
	// value's fields apart, so keeping l's own would keep l.h.)
	held := local{h: kept, rank: l.rank, world: l.world, bufArr: l.bufArr, padArr: l.padArr,
		bufs: append([]uintptr(nil), l.bufs...), pads: append([]uintptr(nil), l.pads...), ranks: append([]int(nil), l.ranks...)}
	st.pending = append(st.pending, ceCall{seq: seq, at: now, digest: c.Digest, channel: c.Channel, l: held})
	// Armed for later than this call's deadline (the calls of another
	// group, with a longer timeout, on the same pad's state): re-armed.
	if deadline := now.Add(l.h.Timeout); st.timer == nil || st.timerAt.After(deadline) {
		st.arm(deadline)
	}
}

// arm sets the watchdog's timer to fire at t (st.mu held).
func (st *ceState) arm(t time.Time) {
	if st.timer != nil {
		st.timer.Stop()
	}
	st.timer, st.timerAt = time.AfterFunc(time.Until(t), st.check), t
}

// trim drops the calls whose number the completion word has reached
// (st.mu held).
func (st *ceState) trim() {
	done := loadWord(st.done)
	i := 0
	for i < len(st.pending) && core.Reached(done, st.pending[i].seq) {
		i++
	}
	st.pending = st.pending[i:]
}

// ceFailure is a (group, channel) whose watchdog gave up a call: until
// the stream has drained (every call enqueued before the stop has
// passed its waits) the watchdog releases the waits again every
// ceDrainEvery, then marks our opening flags in the peers' pads as given
// up. It holds the handle entered meanwhile, so that its memory stays
// mapped; until bounds it.
type ceFailure struct {
	l     local
	leave func()
	until time.Time
}

// ceDrainEvery is how often a failed (group, channel)'s watchdog looks at
// the stream while it drains.
const ceDrainEvery = 5 * time.Millisecond

// check is the watchdog's timer: it re-arms for the oldest unfinished
// call, or fails it once the group's timeout has passed since it was
// enqueued; after a failure it drains the stream (ceFailure).
func (st *ceState) check() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.timer = nil
	st.trim()
	if f := st.fail; f != nil {
		switch {
		case len(st.pending) == 0:
			f.l.cePoison(st.failChannel, st.failDigest)
		case time.Now().Before(f.until):
			f.l.ceRelease(st.pending[0])
			st.arm(time.Now().Add(ceDrainEvery))
			return
		default:
			fmt.Fprintf(os.Stderr, "libsymmem: group %q: rank %d: the stream of a copy-engine collective did not drain within %v after its waits were released; its memory stays mapped until it does\n",
				f.l.h.GroupName, f.l.global(f.l.rank), f.l.h.Timeout)
			st.pending = nil
		}
		f.leave()
		st.fail = nil
		return
	}
	if len(st.pending) == 0 {
		return
	}
	oldest := st.pending[0]
	timeout := oldest.l.h.Timeout
	if deadline := oldest.at.Add(timeout); time.Now().Before(deadline) {
		st.arm(deadline)
		return
	}
	leave, err := oldest.l.h.port.Enter()
	if err != nil {
		st.pending = nil // released, aborted or already stopped: nothing of ours to release safely
		return
	}
	st.fail = &ceFailure{l: oldest.l, leave: leave, until: time.Now().Add(timeout)}
	st.failChannel, st.failDigest = oldest.channel, oldest.digest
	oldest.l.ceGiveUp(st, oldest)
	oldest.l.ceRelease(oldest)
	st.arm(time.Now().Add(ceDrainEvery))
}

// ceGaveUpValue is what a rank whose watchdog gave up a call with digest d
// stores into its opening flag in every peer's pad once its stream has
// drained: bit 30 and the digest's low 30 bits, not a value any call waits
// for (an opening value has bit 31 set, the others are 1), so a late
// peer's opening wait never passes, and its own watchdog names us. The
// digest stays readable: a peer whose own call has other arguments is told
// of a mismatch, not of a peer that gave up, whichever watchdog fired
// first.
func ceGaveUpValue(d uint32) uint32 { return 0x40000000 | d&0x3fffffff }

// ceGaveUp says whether v, read from a peer's opening flag, is a given-up
// mark, and if so whether the call given up had digest d's arguments.
func ceGaveUp(v, d uint32) (gaveUp, same bool) {
	return v&0xc0000000 == 0x40000000, v == ceGaveUpValue(d)
}

// ceGiveUp fails a copy-engine call that did not finish within the
// group's timeout (Note [Copy-engine collectives]): it finds why, and
// says so in the stop word's pinned mirror (the next call on the group
// fails naming it) and in the pads' stop words (for the kernels).
func (l local) ceGiveUp(st *ceState, call ceCall) {
	be, device := l.h.Backend, l.h.Device
	ps, w, ch := l.h.SignalPadSize, l.world, call.channel
	set := ch * core.CollMaxBlocks
	// Read our flags of the channel (device memory) into the pinned words:
	// a peer that gave up, or whose opening flag holds another digest (a
	// mismatch); otherwise the first peer (after us) none of whose flags
	// is set is the one that did not come.
	waited := (l.rank + 1) % w
	flag := uint32(0)
	if bm, ok := be.(core.BoundedMemOps); ok && st.done != 0 {
		n := uintptr(4 * core.CopyEnginePhases * w)
		first := l.pads[l.rank] + core.CopyEngineFlag(ps, w, ch, 0, 0)
		if bm.CopyWithin(device, st.done+4, first, n, l.h.Timeout) == nil {
			flagOf := func(phase, p int) uint32 { return loadWord(st.done + 4 + uintptr(4*(phase*w+p))) }
			open, silent := ceOpenValue(call.digest), -1
			for k := 1; k < w && flag == 0; k++ {
				p := (l.rank + k) % w
				v := flagOf(ceOpen, p)
				gaveUp, same := ceGaveUp(v, call.digest)
				switch {
				case gaveUp && same:
					flag = core.DevGaveUp(l.global(p), core.DevCauseTimeout, set)
				case v != 0 && v != open:
					flag = core.DevFlag(core.DevCauseMismatch, l.global(p), set)
				case silent < 0 && v == 0 && flagOf(ceMiddle, p) == 0 && flagOf(ceClose, p) == 0:
					silent = p
				}
			}
			if silent >= 0 {
				waited = silent
			}
		}
	}
	if flag == 0 {
		flag = core.DevFlag(core.DevCauseTimeout, l.global(waited), set)
	}
	storeWordCAS(l.h.StopMirror, flag)
	ops := []core.MemOp{{Addr: l.pads[l.rank] + ps + 4*core.DevStopWord, Value: flag}}
	gaveUp := core.DevGaveUp(l.rank, core.DevCauseTimeout, set)
	for p := 0; p < w; p++ {
		if p != l.rank {
			ops = append(ops, core.MemOp{Addr: l.pads[p] + ps + 4*core.DevStopWord, Value: gaveUp})
		}
	}
	l.writeWords(ops, "stopping the group's collectives")
}

// ceRelease stores into our flags of call's channel the values its waits
// wait for, so that a stream stuck in them moves on.
func (l local) ceRelease(call ceCall) {
	ps, w := l.h.SignalPadSize, l.world
	var ops []core.MemOp
	for phase := 0; phase < core.CopyEnginePhases; phase++ {
		for p := 0; p < w; p++ {
			if p != l.rank {
				ops = append(ops, core.MemOp{Addr: l.pads[l.rank] + core.CopyEngineFlag(ps, w, call.channel, phase, p), Value: ceFlagValue(phase, call.digest)})
			}
		}
	}
	l.writeWords(ops, "releasing a stuck copy-engine collective")
}

// cePoison stores ceGaveUpValue of the call given up (digest) into our
// opening flag of channel in every peer's pad (our stream has drained:
// none of our calls will store there).
func (l local) cePoison(channel int, digest uint32) {
	ps, w := l.h.SignalPadSize, l.world
	var ops []core.MemOp
	for p := 0; p < w; p++ {
		if p != l.rank {
			ops = append(ops, core.MemOp{Addr: l.pads[p] + core.CopyEngineFlag(ps, w, channel, ceOpen, l.rank), Value: ceGaveUpValue(digest)})
		}
	}
	l.writeWords(ops, "marking a given-up copy-engine collective in the peers' pads")
}

// writeWords stores ops with the backend's WordWriter (nothing where it
// has none), bounded by the group's timeout; a failure is printed (the
// watchdog has no caller).
func (l local) writeWords(ops []core.MemOp, what string) {
	ww, ok := l.h.Backend.(core.WordWriter)
	if !ok {
		return
	}
	if err := ww.WriteWordsWithin(l.h.Device, ops, l.h.Timeout); err != nil {
		fmt.Fprintf(os.Stderr, "libsymmem: group %q: rank %d: %s: %v\n", l.h.GroupName, l.global(l.rank), what, err)
	}
}

// loadWord loads the 32-bit word at addr (pinned host memory; 0 reads as 0).
func loadWord(addr uintptr) uint32 {
	if addr == 0 {
		return 0
	}
	return atomic.LoadUint32((*uint32)(unmanaged.Pointer(addr)))
}

// storeWordCAS stores v at addr (pinned host memory) unless it holds a
// value already (the first failure stays).
func storeWordCAS(addr uintptr, v uint32) {
	if addr != 0 {
		atomic.CompareAndSwapUint32((*uint32)(unmanaged.Pointer(addr)), 0, v)
	}
}
