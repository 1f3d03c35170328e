package symm

// Rank-side scenarios, run either by one process per rank (TestHelperRank,
// re-executed test binary, alloc.Default() on SYMMEM_BACKEND=host) or by one
// goroutine per rank with a runtime of its own (in-process tests).

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/ipc"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

type rankEnv struct {
	rt      *alloc.Runtime
	rank    int
	world   int
	name    string
	dir     string
	timeout time.Duration
	arg     int // scenario-specific
	device  int // the device of this rank's buffers (0 unless set)
}

func (e *rankEnv) opts(name string, rank, world int) Options {
	return Options{Name: name, Rank: rank, World: world, Device: e.device, Timeout: e.timeout, Runtime: e.rt, SocketDir: e.dir, JobToken: "symm-test"}
}

// words views n 64-bit words at addr.
func words(addr uintptr, n int) []uint64 { return unsafe.Slice((*uint64)(unmanaged.Pointer(addr)), n) }

func val(writer, owner, round int) uint64 {
	return uint64(writer)<<40 | uint64(owner)<<20 | uint64(round) + 1
}

// writeAll has every rank write its word into every rank's block (slot
// [rank]) through h, barrier, then check what the others wrote into ours.
func writeAll(h *Handle, round int) error {
	me, world := h.Rank(), h.World()
	for p := 0; p < world; p++ {
		ptr, err := h.BufferPtr(p)
		if err != nil {
			return err
		}
		atomic.StoreUint64(&words(ptr, world)[me], val(me, p, round))
	}
	if err := h.Barrier(0, 0, 0); err != nil {
		return err
	}
	own, _ := h.BufferPtr(me)
	for w := 0; w < world; w++ {
		if got, want := atomic.LoadUint64(&words(own, world)[w]), val(w, me, round); got != want {
			return fmt.Errorf("round %d: rank %d's word in rank %d's block is %#x, want %#x", round, w, me, got, want)
		}
	}
	// Nobody writes the next round before everyone has checked this one.
	return h.Barrier(1, 0, 0)
}

func runScenario(sc string, e *rankEnv) error {
	a, err := e.rt.Allocator(0)
	if err != nil {
		return err
	}
	switch sc {
	case "write":
		return scWrite(e, a)
	case "pingpong":
		return scPingPong(e, a)
	case "subgroup":
		return scSubgroup(e, a)
	case "mismatch-size":
		size := uintptr(64 << 10)
		if e.rank == e.world-1 {
			size = 128 << 10
		}
		return rendezvousOnly(e, a, size, 0)
	case "mismatch-pad":
		// The last rank sets another signal pad size than the others (whose
		// pads were made and exchanged with the group): every rank must fail
		// the first rendezvous, none may hang or map a pad of the wrong size.
		buf, g, err := join(e, a, 4096)
		if err != nil {
			return err
		}
		defer g.Destroy()
		if e.rank == e.world-1 {
			if err := g.SetSignalPadSize(uintptr(8 * e.world)); err != nil {
				return err
			}
		}
		h, err := g.Rendezvous(buf)
		if err == nil {
			h.Release()
			return fmt.Errorf("rendezvous succeeded with different signal pad sizes")
		}
		return err
	case "diverged":
		if e.rank == 1 {
			if _, err := a.Alloc(4096, 0); err != nil {
				return err
			}
		}
		return rendezvousOnly(e, a, 4096, 0)
	case "exit-before":
		g, err := New(e.opts(e.name, e.rank, e.world))
		if err != nil {
			return err
		}
		if e.rank == e.arg {
			os.Exit(3)
		}
		buf, _ := a.Alloc(4096, 0)
		h, err := g.Rendezvous(buf)
		if err == nil {
			h.Release()
			return fmt.Errorf("rendezvous succeeded without rank %d", e.arg)
		}
		return err
	case "bad-pointer":
		// Rank 1 passes a pointer that is not ours: everyone fails with
		// its error.
		buf, _ := a.Alloc(4096, 0)
		if e.rank == 1 {
			buf = uintptr(unsafe.Pointer(&e.arg))
		}
		g, err := New(e.opts(e.name, e.rank, e.world))
		if err != nil {
			return err
		}
		defer g.Destroy()
		h, err := g.Rendezvous(buf)
		if err == nil {
			h.Release()
		}
		return err
	case "counts":
		return scCounts(e, a)
	case "badargs":
		return scBadArgs(e, a)
	case "leak":
		return scLeak(e, a)
	case "callback":
		return scCallback(e, a)
	case "coll":
		return scColl(e, a)
	case "coll-bad":
		return scCollBad(e, a)
	case "coll-groups":
		return scCollGroups(e, a)
	case "coll-mismatch":
		return scCollMismatch(e, a)
	}
	if f, ok := moreScenarios[sc]; ok {
		return f(e, a)
	}
	return fmt.Errorf("unknown scenario %q", sc)
}

// join allocates size bytes and creates this rank's member of the world
// group e names; the caller destroys the group.
func join(e *rankEnv, a *alloc.Allocator, size uintptr) (uintptr, *Group, error) {
	buf, err := a.Alloc(size, 0)
	if err != nil {
		return 0, nil, err
	}
	g, err := New(e.opts(e.name, e.rank, e.world))
	return buf, g, err
}

// joinRendezvous is join plus a rendezvous on the buffer; done releases the
// handle and destroys the group.
func joinRendezvous(e *rankEnv, a *alloc.Allocator, size uintptr) (h *Handle, done func(), err error) {
	buf, g, err := join(e, a, size)
	if err != nil {
		return nil, nil, err
	}
	if h, err = g.Rendezvous(buf); err != nil {
		g.Destroy()
		return nil, nil, err
	}
	return h, func() { h.Release(); g.Destroy() }, nil
}

func rendezvousOnly(e *rankEnv, a *alloc.Allocator, size uintptr, offset uintptr) error {
	buf, g, err := join(e, a, size)
	if err != nil {
		return err
	}
	defer g.Destroy()
	h, err := g.Rendezvous(buf + offset)
	if err != nil {
		return err
	}
	return h.Release()
}

func scWrite(e *rankEnv, a *alloc.Allocator) error {
	buf, g, err := join(e, a, 64<<10)
	if err != nil {
		return err
	}
	h, err := g.Rendezvous(buf)
	if err != nil {
		return err
	}
	if h.BufferSize() != 64<<10 || h.Offset() != 0 || h.SignalPadSize() != DefaultSignalPadSize || h.World() != e.world || h.Rank() != e.rank {
		return fmt.Errorf("handle: size %d offset %d pad %d world %d rank %d", h.BufferSize(), h.Offset(), h.SignalPadSize(), h.World(), h.Rank())
	}
	if b, _ := h.BufferPtr(e.rank); b != buf {
		return fmt.Errorf("own buffer pointer %#x, want the block %#x", b, buf)
	}
	// The C arrays hold the same pointers.
	host, dev := h.BufferPtrs()
	if host != dev {
		return fmt.Errorf("host backend: device arrays must be the host arrays")
	}
	arr := unsafe.Slice((*uintptr)(unmanaged.Pointer(host)), e.world)
	pads, _ := h.SignalPadPtrs()
	parr := unsafe.Slice((*uintptr)(unmanaged.Pointer(pads)), e.world)
	for r := 0; r < e.world; r++ {
		b, _ := h.BufferPtr(r)
		p, _ := h.SignalPadPtr(r)
		if arr[r] != b || parr[r] != p {
			return fmt.Errorf("pointer arrays disagree at rank %d", r)
		}
	}
	for round := 0; round < 3; round++ {
		if err := writeAll(h, round); err != nil {
			return err
		}
	}
	// Interior pointer of a second block in the same segment: no
	// descriptor exchange (the segment is already mapped everywhere).
	ex := g.exchanges
	buf2, err := a.Alloc(8192, 0)
	if err != nil {
		return err
	}
	h2, err := g.Rendezvous(buf2 + 100)
	if err != nil {
		return err
	}
	if g.exchanges != ex {
		return fmt.Errorf("a rendezvous on an already mapped segment exchanged descriptors")
	}
	if h2.Offset() != 100 || h2.BufferSize() != 8192 {
		return fmt.Errorf("interior rendezvous: offset %d size %d, want 100 and 8192", h2.Offset(), h2.BufferSize())
	}
	if b, _ := h2.BufferPtr(e.rank); b != buf2 {
		return fmt.Errorf("interior rendezvous: own block %#x, want %#x", b, buf2)
	}
	if err := writeAll(h2, 10); err != nil {
		return err
	}
	if a, _ := h2.BufferPtrs(); a == host {
		return fmt.Errorf("handles of different buffers share pointer arrays")
	}
	// A rendezvous again on buf shares h's arrays (Note [Shared pointer
	// arrays]), which outlive the release of either handle.
	h3, err := g.Rendezvous(buf)
	if err != nil {
		return err
	}
	if a, _ := h3.BufferPtrs(); a != host {
		return fmt.Errorf("a rendezvous again on the same buffer made new pointer arrays")
	}
	if err := h3.Release(); err != nil {
		return err
	}
	for r := 0; r < e.world; r++ {
		if b, _ := h.BufferPtr(r); arr[r] != b {
			return fmt.Errorf("pointer arrays changed at rank %d after releasing a sharing handle", r)
		}
	}
	if err := h2.Release(); err != nil {
		return err
	}
	if err := h2.Release(); core.CodeOf(err) != core.ErrInvalidState {
		return fmt.Errorf("second release: %v", err)
	}
	// The handle survives the group and the local free.
	if err := g.Destroy(); err != nil {
		return err
	}
	if err := writeAll(h, 20); err != nil {
		return fmt.Errorf("after destroying the group: %w", err)
	}
	if err := a.Free(buf, 64<<10, 0); err != nil {
		return err
	}
	if err := writeAll(h, 21); err != nil {
		return fmt.Errorf("after freeing the block: %w", err)
	}
	return h.Release()
}

// scPingPong: ranks pair up (r, r^1); for 1000 rounds the even rank writes
// a value into its partner's block and signals, the odd rank waits, checks,
// answers in the even rank's block and signals back.
func scPingPong(e *rankEnv, a *alloc.Allocator) error {
	h, done, err := joinRendezvous(e, a, 4096)
	if err != nil {
		return err
	}
	defer done()
	me := e.rank
	peer := me ^ 1
	if peer >= e.world {
		return h.Barrier(0, 0, 0)
	}
	own, _ := h.BufferPtr(me)
	mine := words(own, 1)
	theirs, _ := h.BufferPtr(peer)
	tw := words(theirs, 1)
	ch := me / 2 % h.Channels()
	for i := 1; i <= 1000; i++ {
		if me%2 == 0 {
			tw[0] = uint64(i) // a plain store: the put orders it
			if err := h.PutSignal(peer, ch, 0, 0); err != nil {
				return err
			}
			if err := h.WaitSignal(peer, ch, 0, 0); err != nil {
				return err
			}
			if mine[0] != uint64(i)*3 {
				return fmt.Errorf("round %d: answer %d, want %d", i, mine[0], i*3)
			}
		} else {
			if err := h.WaitSignal(peer, ch, 0, 0); err != nil {
				return err
			}
			if mine[0] != uint64(i) {
				return fmt.Errorf("round %d: got %d", i, mine[0])
			}
			tw[0] = uint64(i) * 3
			if err := h.PutSignal(peer, ch, 0, 0); err != nil {
				return err
			}
		}
	}
	return h.Barrier(0, 0, 0)
}

// scCounts checks Note [Signals]: puts do not wait for the receiver, each
// wait consumes one signal, a wait that times out consumes none, and every
// slot holds exactly the number of signals its sender put.
func scCounts(e *rankEnv, a *alloc.Allocator) error {
	h, done, err := joinRendezvous(e, a, 4096)
	if err != nil {
		return err
	}
	defer done()
	me, world := e.rank, e.world
	nxt, prev := (me+1)%world, (me+world-1)%world
	if h.Channels() < 3 {
		return fmt.Errorf("%d channels, want 3 or more", h.Channels())
	}
	start := time.Now()
	for i := 0; i < 5; i++ { // nobody waits yet: the puts must not block
		if err := h.PutSignal(nxt, 1, 0, 0); err != nil {
			return err
		}
	}
	if d := time.Since(start); d > time.Second {
		return fmt.Errorf("5 puts with nobody waiting took %v", d)
	}
	for i := 0; i < 5; i++ {
		if err := h.WaitSignal(prev, 1, 0, 0); err != nil {
			return fmt.Errorf("wait %d of 5: %v", i+1, err)
		}
	}
	if err := h.WaitSignal(prev, 1, 0, 30*time.Millisecond); core.CodeOf(err) != core.ErrTimeout {
		return fmt.Errorf("a sixth wait for five puts: %v, want a timeout", err)
	}
	if err := h.Barrier(0, 0, 0); err != nil {
		return err
	}
	// The timed-out wait gave its number back: one more put is one more wait.
	if err := h.PutSignal(nxt, 1, 0, 0); err != nil {
		return err
	}
	if err := h.WaitSignal(prev, 1, 0, 0); err != nil {
		return fmt.Errorf("the wait after a timed-out one: %v", err)
	}
	for i := 0; i < 3; i++ {
		if err := h.Barrier(0, 0, 0); err != nil {
			return err
		}
	}
	// 4 barriers on channel 0: every peer's count there is 4, ours 0; on
	// channel 1 prev put 6 (with world 2, prev is nxt and the same holds).
	own := unsafe.Slice((*uint32)(unmanaged.Pointer(h.padPtrs[me])), 2*world)
	for p := 0; p < world; p++ {
		want0, want1 := uint32(4), uint32(0)
		if p == me {
			want0 = 0
		}
		if p == prev {
			want1 = 6
		}
		if got := atomic.LoadUint32(&own[p]); got != want0 {
			return fmt.Errorf("channel 0: rank %d's count in rank %d's pad is %d, want %d", p, me, got, want0)
		}
		if got := atomic.LoadUint32(&own[world+p]); got != want1 {
			return fmt.Errorf("channel 1: rank %d's count in rank %d's pad is %d, want %d", p, me, got, want1)
		}
	}
	if got := atomic.LoadUint32(&h.sig.seen[h.sig.index(prev, 1)]); got != 6 {
		return fmt.Errorf("rank %d has waited for %d signals from rank %d on channel 1, want 6", me, got, prev)
	}
	// Nobody leaves before everyone has checked; on channel 2, so that a
	// fast rank's puts do not change the counts a slow one is checking.
	return h.Barrier(2, 0, 0)
}

// scSubgroup: the world group and a 2-rank subgroup (ranks 2k, 2k+1)
// rendezvous on the same buffer; each has its own pads.
func scSubgroup(e *rankEnv, a *alloc.Allocator) error {
	buf, g, err := join(e, a, 64<<10)
	if err != nil {
		return err
	}
	defer g.Destroy()
	sub, err := New(e.opts(fmt.Sprintf("%s-pair%d", e.name, e.rank/2), e.rank%2, 2))
	if err != nil {
		return err
	}
	defer sub.Destroy()
	if err := sub.SetSignalPadSize(256); err != nil {
		return err
	}
	hw, err := g.Rendezvous(buf)
	if err != nil {
		return err
	}
	defer hw.Release()
	hs, err := sub.Rendezvous(buf)
	if err != nil {
		return err
	}
	defer hs.Release()
	if hs.SignalPadSize() != 256 || hs.World() != 2 || hs.Rank() != e.rank%2 {
		return fmt.Errorf("subgroup handle: pad %d world %d rank %d", hs.SignalPadSize(), hs.World(), hs.Rank())
	}
	wp, _ := hw.SignalPadPtr(e.rank)
	sp, _ := hs.SignalPadPtr(e.rank % 2)
	if wp == sp {
		return fmt.Errorf("the subgroup shares the world group's signal pad")
	}
	// The subgroup's view of the partner's block is the same memory as the
	// world group's (a different mapping of it).
	partner := e.rank ^ 1
	if partner >= e.world {
		return fmt.Errorf("subgroup scenario needs an even world")
	}
	if err := writeAll(hw, 0); err != nil {
		return err
	}
	pw, _ := hw.BufferPtr(partner)
	ps, _ := hs.BufferPtr(partner % 2)
	if got, want := words(ps, e.world)[partner], words(pw, e.world)[partner]; got != want {
		return fmt.Errorf("the subgroup sees %#x in the partner's block, the world group %#x", got, want)
	}
	for i := 0; i < 50; i++ {
		if err := hs.Barrier(i%hs.Channels(), 0, 0); err != nil {
			return err
		}
		if err := hw.Barrier(2, 0, 0); err != nil {
			return err
		}
	}
	return nil
}

func scBadArgs(e *rankEnv, a *alloc.Allocator) error {
	buf, _ := a.Alloc(4096, 0)
	g, err := New(e.opts(e.name, e.rank, e.world))
	if err != nil {
		return err
	}
	defer g.Destroy()
	for _, bad := range []uintptr{0, 6, uintptr(4*e.world - 4), 1<<30 + 4} {
		if err := g.SetSignalPadSize(bad); core.CodeOf(err) != core.ErrInvalidArgument {
			return fmt.Errorf("SetSignalPadSize(%d): %v", bad, err)
		}
	}
	if err := g.SetSignalPadSize(uintptr(8 * e.world)); err != nil { // 2 channels
		return err
	}
	h, err := g.Rendezvous(buf)
	if err != nil {
		return err
	}
	if err := g.SetSignalPadSize(4096); core.CodeOf(err) != core.ErrInvalidState {
		return fmt.Errorf("SetSignalPadSize after rendezvous: %v", err)
	}
	if h.Channels() != 2 {
		return fmt.Errorf("channels %d, want 2", h.Channels())
	}
	check := func(what string, err error, code core.Code, contains string) error {
		if core.CodeOf(err) != code || !strings.Contains(err.Error(), contains) {
			return fmt.Errorf("%s: got %v, want code %v with %q", what, err, code, contains)
		}
		return nil
	}
	for _, c := range []struct {
		what     string
		err      error
		code     core.Code
		contains string
	}{
		{"put to rank -1", h.PutSignal(-1, 0, 0, 0), core.ErrInvalidArgument, fmt.Sprintf("[0, %d)", e.world)},
		{"put to rank world", h.PutSignal(e.world, 0, 0, 0), core.ErrInvalidArgument, fmt.Sprintf("[0, %d)", e.world)},
		{"wait on channel 2", h.WaitSignal(0, 2, 0, 0), core.ErrInvalidArgument, "channel 2 is out of range [0, 2)"},
		{"barrier on channel -1", h.Barrier(-1, 0, 0), core.ErrInvalidArgument, "[0, 2)"},
		{"wait that times out", h.WaitSignal((e.rank+1)%e.world, 1, 0, 50*time.Millisecond), core.ErrTimeout, fmt.Sprintf("rank %d's signal on channel 1", (e.rank+1)%e.world)},
	} {
		if err := check(c.what, c.err, c.code, c.contains); err != nil {
			return err
		}
	}
	if _, err := h.BufferPtr(e.world); core.CodeOf(err) != core.ErrInvalidArgument {
		return fmt.Errorf("BufferPtr(world): %v", err)
	}
	if _, err := h.SignalPadPtr(-1); core.CodeOf(err) != core.ErrInvalidArgument {
		return fmt.Errorf("SignalPadPtr(-1): %v", err)
	}
	if err := h.Barrier(0, 0, 0); err != nil {
		return err
	}
	if err := h.Release(); err != nil {
		return err
	}
	if err := check("barrier on a released handle", h.Barrier(0, 0, 0), core.ErrInvalidState, "released"); err != nil {
		return err
	}
	// A device the host backend does not have: the call fails at once, and
	// the peers time out naming the rank that never joined.
	o := e.opts(e.name+"-dev", e.rank, e.world)
	o.Timeout = 300 * time.Millisecond
	if e.rank == 0 {
		o.Device = 5
		start := time.Now()
		_, err = New(o)
		if time.Since(start) > 100*time.Millisecond {
			return fmt.Errorf("a bad device took %v to fail", time.Since(start))
		}
		return check("group on device 5", err, core.ErrInvalidDevice, "device 5")
	}
	_, err = New(o)
	return check("group whose rank 0 has a bad device", err, core.ErrTimeout, "rank 0 never")
}

// scLeak: 1000 rendezvous/release cycles, each exchanging descriptors (the
// mappings go with the handles), leave no descriptor and no mapping behind.
func scLeak(e *rankEnv, a *alloc.Allocator) error {
	buf, _ := a.Alloc(4096, 0)
	countFDs() // the first reads open the runtime's poller descriptors
	countMaps()
	fds0, maps00 := countFDs(), countMaps()
	g, err := New(e.opts(e.name, e.rank, e.world))
	if err != nil {
		return err
	}
	cycle := func() error {
		h, err := g.Rendezvous(buf)
		if err != nil {
			return err
		}
		if err := h.Barrier(0, 0, 0); err != nil {
			return err
		}
		return h.Release()
	}
	if err := cycle(); err != nil { // warm up
		return err
	}
	before, maps0 := countFDs(), countMaps()
	ex := g.exchanges
	n := e.arg
	for i := 0; i < n; i++ {
		if err := cycle(); err != nil {
			return fmt.Errorf("cycle %d: %w", i, err)
		}
	}
	if g.exchanges-ex != n {
		return fmt.Errorf("%d exchanges in %d cycles: released mappings must not be reused", g.exchanges-ex, n)
	}
	if err := g.Destroy(); err != nil {
		return err
	}
	after, maps1 := countFDs(), countMaps()
	if after > before || maps1 > maps0 {
		return fmt.Errorf("after %d cycles: %d descriptors (before %d), %d mappings (before %d)", n, after, before, maps1, maps0)
	}
	// Destroying the group (its last reference) returned its pads too.
	if after != fds0 || maps1 != maps00 {
		return fmt.Errorf("after destroying the group: %d descriptors and %d memfd mappings, %d and %d before it was created (open now: %s)", after, maps1, fds0, maps00, listFDs())
	}
	return nil
}

// scCallback: records travel through a caller's all-gather (here another
// ipc channel standing in for MPI), descriptors through the group's sockets.
func scCallback(e *rankEnv, a *alloc.Allocator) error {
	other, err := ipc.Open(ipc.Config{Name: e.name + "-mpi", Rank: e.rank, World: e.world, Dir: e.dir, Timeout: e.timeout, Token: "mpi"})
	if err != nil {
		return err
	}
	defer other.Close()
	calls := 0
	o := e.opts(e.name, e.rank, e.world)
	o.JobToken = ""
	o.AllGather = func(send, recv []byte) error {
		calls++
		all, err := other.AllGather(0, send)
		if err != nil {
			return err
		}
		for r, b := range all {
			copy(recv[r*len(send):], b)
		}
		return nil
	}
	g, err := New(o)
	if err != nil {
		return err
	}
	defer g.Destroy()
	buf, _ := a.Alloc(64<<10, 0)
	h, err := g.Rendezvous(buf)
	if err != nil {
		return err
	}
	defer h.Release()
	if calls == 0 {
		return fmt.Errorf("the callback was never called")
	}
	return writeAll(h, 0)
}

func countFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

func listFDs() string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var s []string
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		s = append(s, e.Name()+"="+l)
	}
	return strings.Join(s, " ")
}

// countMaps counts mappings of memfds (segments and pads, ours and peers').
func countMaps() int {
	b, _ := os.ReadFile("/proc/self/maps")
	return strings.Count(string(b), "/memfd:")
}
