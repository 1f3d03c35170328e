package symm

// testComm is a Communicator for in-process tests: ranks are goroutines of
// one process, each with a runtime of its own over the host backend, so
// every rank's host memory is addressable by every other. It implements the
// optional engine interfaces (reducer, splitter, oneSided, lsaTeam) the way
// NCCL defines them, synchronously (the host backend's stream is 0), with
// the reduction in rank order and fp32 accumulation for 16-bit types, as
// the stand-in NCCL does. A rank that does not arrive within the timeout
// makes the others fail with ErrTimeout naming it.

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/symm/coll"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

type testHub struct {
	world   int
	timeout time.Duration
	// machine[r] is rank r's imitated machine (LSA peers share one).
	machine []string
	// oneSided: whether the communicators have the 2.29 signals.
	oneSided bool

	mu     sync.Mutex
	rounds map[int]*testRound
	subs   map[string]*testHub
	// sig[(dst*world+src)*slots+slot] counts signals src put to dst.
	sig []uint32
	// windows counts registrations (tests read it); closes counts Close
	// calls on this hub's communicators (made by Split).
	windows, deregs, closes int
	// liveWins holds the windows registered and not yet deregistered.
	liveWins map[uintptr]bool
	// boxes[[2]int{src, dst}] holds the transfers src sent to dst that dst
	// has not received, in order.
	boxes map[[2]int][][]byte
	// p2pGroups counts SendRecv calls, p2pBytes[src*world+dst] the bytes
	// src sent to dst through them (tests read both).
	p2pGroups int
	p2pBytes  []uintptr
}

const testSlots = 64

// testRound is one collective call: every rank deposits its arguments,
// waits until all have, does its part, and waits until all have done it
// (so that in-place outputs never overwrite an input a peer still reads).
type testRound struct {
	args    []any
	arrived int
	all     chan struct{}
	done    int
	left    chan struct{}
}

func newTestHub(world int, timeout time.Duration, machine []string, oneSided bool) *testHub {
	return &testHub{world: world, timeout: timeout, machine: machine, oneSided: oneSided,
		rounds: map[int]*testRound{}, subs: map[string]*testHub{}, liveWins: map[uintptr]bool{}, sig: make([]uint32, world*world*testSlots),
		boxes: map[[2]int][][]byte{}, p2pBytes: make([]uintptr, world*world)}
}

type testComm struct {
	hub   *testHub
	rank  int
	calls int
	seen  []uint32 // seen[src*slots+slot]: signals waited for
	// failAt makes call number failAt fail (0: never), counting from 1.
	failAt int
	// deregs counts this rank's DeregisterWindow calls; the call numbered
	// failDereg fails (0: none), leaving its window registered. Both are
	// guarded by hub.mu.
	deregs, failDereg int
}

// failDeregistration makes this rank's nth next DeregisterWindow call
// fail (1 = the next one), as a communicator that refuses it: the window
// stays registered.
func (c *testComm) failDeregistration(n int) {
	c.hub.mu.Lock()
	defer c.hub.mu.Unlock()
	c.failDereg = c.deregs + n
}

func newTestComms(world int, timeout time.Duration, machine []string, oneSided bool) []*testComm {
	hub := newTestHub(world, timeout, machine, oneSided)
	cs := make([]*testComm, world)
	for r := range cs {
		cs[r] = &testComm{hub: hub, rank: r, seen: make([]uint32, world*testSlots)}
	}
	return cs
}

func (c *testComm) Rank() int   { return c.rank }
func (c *testComm) World() int  { return c.hub.world }
func (c *testComm) Device() int { return 0 }
func (c *testComm) Describe() string {
	return fmt.Sprintf("test communicator (rank %d of %d)", c.rank, c.hub.world)
}

// round runs one collective call: work sees every rank's args.
func (c *testComm) round(arg any, work func(all []any) error, after ...func()) error {
	h := c.hub
	c.calls++
	n := c.calls
	h.mu.Lock()
	rd := h.rounds[n]
	if rd == nil {
		rd = &testRound{args: make([]any, h.world), all: make(chan struct{}), left: make(chan struct{})}
		h.rounds[n] = rd
	}
	rd.args[c.rank] = arg
	if rd.arrived++; rd.arrived == h.world {
		close(rd.all)
	}
	h.mu.Unlock()
	missing := func() string {
		h.mu.Lock()
		defer h.mu.Unlock()
		var ms []int
		for r, a := range rd.args {
			if a == nil {
				ms = append(ms, r)
			}
		}
		return core.RanksText(ms)
	}
	select {
	case <-rd.all:
	case <-time.After(h.timeout):
		return core.Errorf(core.ErrTimeout, "test communicator: call %d: rank(s) %s never arrived", n, missing())
	}
	err := work(rd.args)
	h.mu.Lock()
	if rd.done++; rd.done == h.world {
		close(rd.left)
		delete(h.rounds, n)
	}
	h.mu.Unlock()
	select {
	case <-rd.left:
	case <-time.After(h.timeout):
		return core.Errorf(core.ErrTimeout, "test communicator: call %d: a rank never finished", n)
	}
	if err == nil {
		for _, f := range after {
			f()
		}
	}
	return err
}

func (c *testComm) AllGather(stream core.Stream, send, recv, n uintptr) error {
	return c.round(send, func(all []any) error {
		tmp := make([]byte, n*uintptr(len(all)))
		for r, a := range all {
			copy(tmp[uintptr(r)*n:], bytesOf(a.(uintptr), n))
		}
		copy(bytesOf(recv, uintptr(len(tmp))), tmp)
		return nil
	})
}

// RegisterWindow gives every registration a handle of its own (a later
// registration of the same memory is another window, as in NCCL), which
// stays live until its deregistration.
func (c *testComm) RegisterWindow(addr, size uintptr) (uintptr, error) {
	err := c.round(addr, func(all []any) error { return nil })
	h := c.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	h.windows++
	if err != nil {
		return 0, err
	}
	win := testWindowBase + uintptr(h.windows)<<8 + uintptr(c.rank)
	h.liveWins[win] = true
	return win, nil
}

// testWindowBase keeps the test windows' handles apart from addresses.
const testWindowBase = 0x5e00_0000_0000

// DeregisterWindow fails for a handle that is not a live window: one never
// registered, or deregistered already.
func (c *testComm) DeregisterWindow(win uintptr) error {
	h := c.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deregs++
	c.deregs++
	if c.deregs == c.failDereg {
		c.failDereg = 0
		return core.Errorf(core.ErrBackend, "test communicator: deregistering window %#x: injected failure", win)
	}
	if !h.liveWins[win] {
		return core.Errorf(core.ErrInvalidArgument, "test communicator: deregistering %#x, which is not a live window", win)
	}
	delete(h.liveWins, win)
	return nil
}

// liveWindowsOf counts the windows of rank's registered and not
// deregistered.
func (h *testHub) liveWindowsOf(rank int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for win := range h.liveWins {
		if int(win&0xff) == rank {
			n++
		}
	}
	return n
}

// liveWindow says whether win is registered and not deregistered.
func (h *testHub) liveWindow(win uintptr) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.liveWins[win]
}

func (c *testComm) PeerPointer(win, offset uintptr, peer int) (uintptr, bool, error) {
	return 0, false, nil
}

func (c *testComm) AllReduce(stream core.Stream, send, recv, count uintptr, dt core.DType, op core.ReduceOp) error {
	return c.fail("all-reduce", func() error {
		var out []byte
		return c.round(send, func(all []any) error {
			bufs := make([]uintptr, len(all))
			for r, a := range all {
				bufs[r] = a.(uintptr)
			}
			out = coll.Reduce(dt, op, bufs, 0, count)
			return nil
		}, func() { copy(bytesOf(recv, uintptr(len(out))), out) })
	})
}

func (c *testComm) ReduceScatter(stream core.Stream, send, recv, recvCount uintptr, dt core.DType, op core.ReduceOp) error {
	return c.fail("reduce-scatter", func() error {
		var out []byte
		return c.round(send, func(all []any) error {
			bufs := make([]uintptr, len(all))
			for r, a := range all {
				bufs[r] = a.(uintptr)
			}
			out = coll.Reduce(dt, op, bufs, uintptr(c.rank)*recvCount*dt.Size(), recvCount)
			return nil
		}, func() { copy(bytesOf(recv, uintptr(len(out))), out) })
	})
}

func (c *testComm) AllGatherTyped(stream core.Stream, send, recv, sendCount uintptr, dt core.DType) error {
	n := sendCount * dt.Size()
	return c.fail("all-gather", func() error {
		var tmp []byte
		return c.round(send, func(all []any) error {
			tmp = make([]byte, n*uintptr(len(all)))
			for r, a := range all {
				copy(tmp[uintptr(r)*n:], bytesOf(a.(uintptr), n))
			}
			return nil
		}, func() { copy(bytesOf(recv, uintptr(len(tmp))), tmp) })
	})
}

// fail runs call unless it is the call failAt names.
func (c *testComm) fail(what string, call func() error) error {
	if c.failAt > 0 && c.calls+1 == c.failAt {
		c.calls++
		return core.Errorf(core.ErrBackend, "test communicator: %s: injected failure", what)
	}
	return call()
}

func (c *testComm) Split(color, key int) (Communicator, error) {
	type ck struct{ color, key int }
	var sub *testComm
	n := c.calls + 1
	err := c.round(ck{color, key}, func(all []any) error {
		var members []int // ranks of our color, by key then rank
		for r, a := range all {
			if a.(ck).color == color {
				members = append(members, r)
			}
		}
		for i := range members {
			for j := i + 1; j < len(members); j++ {
				a, b := all[members[i]].(ck), all[members[j]].(ck)
				if b.key < a.key || (b.key == a.key && members[j] < members[i]) {
					members[i], members[j] = members[j], members[i]
				}
			}
		}
		name := fmt.Sprintf("%d/%d", n, color)
		h := c.hub
		h.mu.Lock()
		defer h.mu.Unlock()
		sh := h.subs[name]
		if sh == nil {
			ms := make([]string, len(members))
			for i, r := range members {
				ms[i] = h.machine[r]
			}
			sh = newTestHub(len(members), h.timeout, ms, h.oneSided)
			h.subs[name] = sh
		}
		for i, r := range members {
			if r == c.rank {
				sub = &testComm{hub: sh, rank: i, seen: make([]uint32, len(members)*testSlots)}
			}
		}
		return nil
	})
	return sub, err
}

func (c *testComm) Close() error {
	c.hub.mu.Lock()
	defer c.hub.mu.Unlock()
	c.hub.closes++
	return nil
}

// splits returns the hubs of the communicators split from this one and how
// many of their ranks' communicators were closed.
func (h *testHub) splits() (hubs, closes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, sh := range h.subs {
		sh.mu.Lock()
		closes += sh.closes
		sh.mu.Unlock()
	}
	return len(h.subs), closes
}

func (c *testComm) OneSided() (bool, string) {
	if c.hub.oneSided {
		return true, "2.29.0 (test)"
	}
	return false, "2.28.9 (test)"
}

func (c *testComm) Signal(stream core.Stream, peer, slot int) error {
	h := c.hub
	if !h.oneSided {
		return core.Errorf(core.ErrUnavailable, "test communicator: one-sided signals need NCCL 2.29, this is 2.28.9")
	}
	if peer < 0 || peer >= h.world || slot < 0 || slot >= testSlots {
		return core.Errorf(core.ErrInvalidArgument, "test communicator: signal to rank %d slot %d", peer, slot)
	}
	h.mu.Lock()
	h.sig[(peer*h.world+c.rank)*testSlots+slot]++
	h.mu.Unlock()
	return nil
}

func (c *testComm) WaitSignal(stream core.Stream, peer, slot, count int) error {
	h := c.hub
	if !h.oneSided {
		return core.Errorf(core.ErrUnavailable, "test communicator: one-sided signals need NCCL 2.29, this is 2.28.9")
	}
	if peer < 0 || peer >= h.world || slot < 0 || slot >= testSlots {
		return core.Errorf(core.ErrInvalidArgument, "test communicator: wait for rank %d slot %d", peer, slot)
	}
	want := c.seen[peer*testSlots+slot] + uint32(count)
	deadline := time.Now().Add(h.timeout)
	for {
		h.mu.Lock()
		got := h.sig[(c.rank*h.world+peer)*testSlots+slot]
		h.mu.Unlock()
		if core.Reached(got, want) {
			c.seen[peer*testSlots+slot] = want
			return nil
		}
		if time.Now().After(deadline) {
			return core.Errorf(core.ErrTimeout, "test communicator: rank %d waited %v for %d signal(s) from rank %d in slot %d", c.rank, h.timeout, count, peer, slot)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func (c *testComm) LSAPeers() ([]int, bool, error) {
	var ps []int
	for r, m := range c.hub.machine {
		if m == c.hub.machine[c.rank] {
			ps = append(ps, r)
		}
	}
	return ps, true, nil
}

// SendRecv posts every send of ops at once (copied: a send never waits),
// then takes each receive's transfer from its peer in order, waiting up to
// the timeout; a receive whose size differs from the send fails naming
// both. Ops of 0 bytes are not posted, as NCCLComm skips them.
func (c *testComm) SendRecv(stream core.Stream, ops []core.P2POp) error {
	h := c.hub
	h.mu.Lock()
	h.p2pGroups++
	for _, op := range ops {
		if op.Peer < 0 || op.Peer >= h.world {
			h.mu.Unlock()
			return core.Errorf(core.ErrInvalidArgument, "test communicator: a transfer with rank %d of %d", op.Peer, h.world)
		}
		if !op.Recv && op.Bytes > 0 {
			k := [2]int{c.rank, op.Peer}
			h.boxes[k] = append(h.boxes[k], append([]byte(nil), bytesOf(op.Addr, op.Bytes)...))
			h.p2pBytes[c.rank*h.world+op.Peer] += op.Bytes
		}
	}
	h.mu.Unlock()
	deadline := time.Now().Add(h.timeout)
	for _, op := range ops {
		if !op.Recv || op.Bytes == 0 {
			continue
		}
		k := [2]int{op.Peer, c.rank}
		for {
			h.mu.Lock()
			q := h.boxes[k]
			if len(q) > 0 {
				h.boxes[k] = q[1:]
			}
			h.mu.Unlock()
			if len(q) > 0 {
				if uintptr(len(q[0])) != op.Bytes {
					return core.Errorf(core.ErrInvalidState, "test communicator: rank %d receives %d bytes from rank %d, which sent %d", c.rank, op.Bytes, op.Peer, len(q[0]))
				}
				copy(bytesOf(op.Addr, op.Bytes), q[0])
				break
			}
			if time.Now().After(deadline) {
				return core.Errorf(core.ErrTimeout, "test communicator: rank %d waited %v for %d bytes from rank %d", c.rank, h.timeout, op.Bytes, op.Peer)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	return nil
}

// sentBytes is how many bytes src sent to dst through SendRecv.
func (h *testHub) sentBytes(src, dst int) uintptr {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.p2pBytes[src*h.world+dst]
}

// bytesOf views n bytes at addr.
func bytesOf(addr, n uintptr) []byte { return unsafe.Slice((*byte)(unmanaged.Pointer(addr)), n) }
