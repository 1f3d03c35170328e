package symm

// Groups that span machines (Note [Local teams], Note [Collectives across
// machines]), imitated in one process: each rank is a goroutine with a
// runtime of its own and a machine identity of its own, and the engine
// between machines is the test communicator (testcomm_test.go).

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/host"
	"github.com/libsymmem/libsymmem/core/symm/coll"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// mmRank is one rank of a multi-machine test.
type mmRank struct {
	rank, world int
	a           *alloc.Allocator
	o           Options
	comm        *testComm
}

// mmConfig says how the ranks of a test are made.
type mmConfig struct {
	machines []int // rank r is on imitated machine machines[r]
	// engine: "comm" (a communicator), "comm228" (one without one-sided
	// signals), "allgather" (the caller's all-gather, no engine), "sockets".
	engine  string
	timeout time.Duration
	// identity, if set, gives rank r's identity instead of the default.
	identity func(r int) machineIdentity
	// backend, if set, wraps rank r's host backend.
	backend func(r int, be *host.Backend) core.Backend
}

func simulated(k int) machineIdentity {
	return machineIdentity{hostname: thisMachine.hostname, bootID: thisMachine.bootID, simulated: fmt.Sprintf("m%d", k)}
}

// runMachines runs fn on every rank, concurrently, and returns their errors.
func runMachines(t *testing.T, c mmConfig, fn func(r *mmRank) error) []error {
	t.Helper()
	world := len(c.machines)
	if c.timeout == 0 {
		c.timeout = 20 * time.Second
	}
	names := make([]string, world)
	for r, m := range c.machines {
		names[r] = fmt.Sprintf("m%d", m)
	}
	comms := newTestComms(world, c.timeout, names, c.engine != "comm228")
	dir := sockDir(t)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		hb, err := host.New()
		require.NoError(t, err)
		var be core.Backend = hb
		if c.backend != nil {
			be = c.backend(r, hb)
		}
		rt := alloc.NewRuntime(be)
		a, err := rt.Allocator(0)
		require.NoError(t, err)
		id := simulated(c.machines[r])
		if c.identity != nil {
			id = c.identity(r)
		}
		o := Options{Name: strings.ReplaceAll(t.Name(), "/", "."), Rank: r, World: world, Timeout: c.timeout, Runtime: rt, SocketDir: dir, JobToken: "mm", machine: &id}
		switch c.engine {
		case "comm", "comm228":
			o.Comm, o.Rank, o.World = comms[r], 0, 0
		case "allgather":
			cm := comms[r]
			o.AllGather = func(send, recv []byte) error {
				return cm.round(send, func(all []any) error {
					for q, b := range all {
						copy(recv[q*len(send):], b.([]byte))
					}
					return nil
				})
			}
		}
		mr := &mmRank{rank: r, world: world, a: a, o: o, comm: comms[r]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[mr.rank] = fn(mr)
		}()
	}
	wg.Wait()
	return errs
}

func requireAllOK(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// requireAllFail requires every rank to fail with code and the messages.
// A rank with another code fails the test with every rank's error logged:
// which rank saw what tells an ordering problem from a wrong verdict.
func requireAllFail(t *testing.T, errs []error, code core.Code, contains ...string) {
	t.Helper()
	for r, err := range errs {
		if core.CodeOf(err) != code {
			for q, e := range errs {
				t.Logf("rank %d: %v", q, e)
			}
			t.Fatalf("rank %d: code %v, want %v", r, core.CodeOf(err), code)
		}
	}
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		require.Equal(t, code, core.CodeOf(err), "rank %d: %v", r, err)
		for _, s := range contains {
			require.Contains(t, err.Error(), s, "rank %d", r)
		}
	}
}

// join makes the group and a handle on a fresh buffer of size bytes.
func (r *mmRank) join(size uintptr) (*Group, *Handle, uintptr, error) {
	return r.joinTagged(size, 0)
}

// joinTagged is join on a buffer of tag (0: untagged).
func (r *mmRank) joinTagged(size uintptr, tag alloc.TagID) (*Group, *Handle, uintptr, error) {
	buf, err := r.a.AllocTagged(size, 0, tag)
	if err != nil {
		return nil, nil, 0, err
	}
	g, err := New(r.o)
	if err != nil {
		return nil, nil, 0, err
	}
	h, err := g.Rendezvous(buf)
	if err != nil {
		g.Destroy()
		return nil, nil, 0, err
	}
	return g, h, buf, nil
}

// checkLayout checks the group's team against machines and the handle's
// pointers: mapped for local ranks, NULL for remote ones.
func checkLayout(g *Group, h *Handle, machines []int) error {
	me := g.Rank()
	var team []int
	for r, m := range machines {
		if m == machines[me] {
			team = append(team, r)
		}
	}
	if err := g.teams.check(g.rank, g.world, g.members); err != nil {
		return err
	}
	if g.LocalSize() != len(team) || team[g.LocalRank()] != me {
		return fmt.Errorf("rank %d: local rank %d of %d, want index in %v", me, g.LocalRank(), g.LocalSize(), team)
	}
	mapped := 0
	for r := range machines {
		local, err := g.IsLocal(r)
		if err != nil {
			return err
		}
		buf, _ := h.BufferPtr(r)
		pad, _ := h.SignalPadPtr(r)
		if local != (machines[r] == machines[me]) {
			return fmt.Errorf("rank %d: IsLocal(%d) = %v", me, r, local)
		}
		if local != (buf != 0) || local != (pad != 0) {
			return fmt.Errorf("rank %d: rank %d (local %v) has buffer %#x and pad %#x", me, r, local, buf, pad)
		}
		if local && r != me {
			mapped++
		}
	}
	if _, err := g.IsLocal(len(machines)); core.CodeOf(err) != core.ErrInvalidArgument {
		return fmt.Errorf("IsLocal(world): %v", err)
	}
	if got := h.MappedPeers(); got != mapped {
		return fmt.Errorf("rank %d: MappedPeers %d, want %d", me, got, mapped)
	}
	return nil
}

// localWrites has every rank store a word into each local peer's block,
// then a barrier, then checks the words its local peers stored in its own.
func localWrites(g *Group, h *Handle, round int) error {
	me, world := h.Rank(), h.World()
	for p := 0; p < world; p++ {
		if ptr, _ := h.BufferPtr(p); ptr != 0 {
			atomic.StoreUint64(&words(ptr, world)[me], val(me, p, round))
		}
	}
	if err := h.Barrier(0, 0, 0); err != nil {
		return err
	}
	own, _ := h.BufferPtr(me)
	for w := 0; w < world; w++ {
		if local, _ := g.IsLocal(w); local {
			if got, want := atomic.LoadUint64(&words(own, world)[w]), val(w, me, round); got != want {
				return fmt.Errorf("round %d: rank %d's word in rank %d's block is %#x, want %#x", round, w, me, got, want)
			}
		}
	}
	return h.Barrier(0, 0, 0)
}

var layouts = map[string][]int{"2x2": {0, 0, 1, 1}, "3x1": {0, 1, 2}, "interleaved": {0, 1, 0, 1}}

func TestMachinesTeamsAndLocalWrites(t *testing.T) {
	for name, machines := range layouts {
		t.Run(name, func(t *testing.T) {
			requireAllOK(t, runMachines(t, mmConfig{machines: machines, engine: "comm"}, func(r *mmRank) error {
				g, h, _, err := r.join(64 << 10)
				if err != nil {
					return err
				}
				defer g.Destroy()
				defer h.Release()
				if err := checkLayout(g, h, machines); err != nil {
					return err
				}
				for round := 0; round < 3; round++ {
					if err := localWrites(g, h, round); err != nil {
						return err
					}
				}
				// A second rendezvous on the same buffer passes no descriptors.
				before := g.exchanges
				buf, _ := h.BufferPtr(r.rank)
				h2, err := g.Rendezvous(buf)
				if err != nil {
					return err
				}
				defer h2.Release()
				if g.exchanges != before {
					return fmt.Errorf("a rendezvous on a mapped buffer exchanged descriptors")
				}
				return checkLayout(g, h2, machines)
			}))
		})
	}
}

// The caller's all-gather spanning machines: rendezvous and local mapping
// work; what needs an engine between machines is UNAVAILABLE, naming it.
func TestMachinesWithoutEngine(t *testing.T) {
	machines := layouts["2x2"]
	requireAllOK(t, runMachines(t, mmConfig{machines: machines, engine: "allgather"}, func(r *mmRank) error {
		g, h, _, err := r.join(64 << 10)
		if err != nil {
			return err
		}
		defer g.Destroy()
		defer h.Release()
		if err := checkLayout(g, h, machines); err != nil {
			return err
		}
		// Local signals work: each rank signals its local peer and waits.
		peer := g.teams.team[1-g.LocalRank()]
		if err := h.PutSignal(peer, 1, 0, 0); err != nil {
			return err
		}
		if err := h.WaitSignal(peer, 1, 0, 0); err != nil {
			return err
		}
		remote := (r.rank + 2) % 4
		for what, err := range map[string]error{
			"all_reduce":  coll.Run(h, coll.Args{Kind: core.AllReduce, DType: core.Float32, Count: 16}),
			"barrier":     h.Barrier(0, 0, 0),
			"put_signal":  h.PutSignal(remote, 0, 0, 0),
			"wait_signal": h.WaitSignal(remote, 0, 0, 0),
		} {
			if core.CodeOf(err) != core.ErrUnavailable || !strings.Contains(err.Error(), "engine between machines") || !strings.Contains(err.Error(), `"m`) {
				return fmt.Errorf("%s: %v, want ErrUnavailable naming the missing engine and the machines", what, err)
			}
		}
		return nil
	}))
}

// A socket group needs one machine and says which ranks are where.
func TestMachinesSocketGroupRefused(t *testing.T) {
	requireAllFail(t, runMachines(t, mmConfig{machines: []int{0, 0, 1}, engine: "sockets"}, func(r *mmRank) error {
		_, _, _, err := r.join(4096)
		return err
	}), core.ErrMismatch, "different machines", `ranks 0, 1: machine "m0"`, `rank 2: machine "m1"`, "NCCL communicator")
}

// SYMMEM_MACHINE_ID can split a machine, never merge two: ranks claiming
// one machine under different kernels are refused.
func TestMachinesIdentityConflict(t *testing.T) {
	requireAllFail(t, runMachines(t, mmConfig{machines: []int{0, 0}, engine: "comm", identity: func(r int) machineIdentity {
		id := simulated(0)
		id.bootID = fmt.Sprintf("boot-%d", r)
		return id
	}}, func(r *mmRank) error {
		_, _, _, err := r.join(4096)
		return err
	}), core.ErrMismatch, "claim one machine", "boot-0", "boot-1", "cannot join two real ones")
}

// A rank that could not read its identity fails the group with that
// failure, naming it, on every rank: never a machine mismatch.
func TestMachinesIdentityUnreadable(t *testing.T) {
	bad := readMachine("/proc/nonexistent/boot_id")
	require.Error(t, bad.err)
	require.Contains(t, bad.err.Error(), "ENOENT")
	requireAllFail(t, runMachines(t, mmConfig{machines: []int{0, 0, 0}, engine: "sockets", identity: func(r int) machineIdentity {
		if r == 1 {
			return bad
		}
		return simulated(0)
	}}, func(r *mmRank) error {
		_, _, _, err := r.join(4096)
		return err
	}), core.ErrBackend, "failed on rank 1", "boot id", "ENOENT")
	// And the library's own identity was read.
	require.NoError(t, thisMachine.err)
	require.NotEmpty(t, thisMachine.bootID)
}

// collCheck fills the inputs, runs one collective and checks the result
// against integer arithmetic (the inputs are small integers, exact in every
// dtype).
func collCheck(h *Handle, kind core.CollKind, dt core.DType, op core.ReduceOp, count uintptr, call int) error {
	return collCheckAlgo(h, kind, dt, op, count, call, core.AlgoAuto, false)
}

// collCheckAlgo is collCheck with an algorithm, in place (all_reduce,
// reduce_scatter) or with out after the input inside the block.
func collCheckAlgo(h *Handle, kind core.CollKind, dt core.DType, op core.ReduceOp, count uintptr, call int, algo core.Algo, inPlace bool) error {
	me, world := h.Rank(), h.World()
	es := dt.Size()
	base, _ := h.BufferPtr(me)
	in := base
	out := base + roundUp(count*es, 16) // after the input, inside the block
	if inPlace && kind != core.AllGather {
		out = in
		if kind == core.ReduceScatter {
			out = in + uintptr(me)*count/uintptr(world)*es
		}
	}
	inputOf := func(r int, i uintptr) int { return (r*7+int(i)*3+call)%23 - 11 }
	for i := uintptr(0); i < count; i++ {
		storeInt(dt, in+i*es, inputOf(me, i))
	}
	a := coll.Args{Kind: kind, DType: dt, Op: op, Count: count, Out: out, Algo: algo}
	if err := coll.Run(h, a); err != nil {
		return err
	}
	reduce := func(i uintptr) int {
		acc := inputOf(0, i)
		for r := 1; r < world; r++ {
			v := inputOf(r, i)
			switch op {
			case core.OpSum:
				acc += v
			case core.OpMax:
				acc = max(acc, v)
			case core.OpMin:
				acc = min(acc, v)
			}
		}
		return acc
	}
	check := func(j uintptr, want int) error {
		if got := loadInt(dt, out+j*es); got != want {
			return fmt.Errorf("rank %d: %s %s %s count %d: element %d is %d, want %d", me, kind, dt, op, count, j, got, want)
		}
		return nil
	}
	switch kind {
	case core.AllReduce:
		for i := uintptr(0); i < count; i++ {
			if err := check(i, reduce(i)); err != nil {
				return err
			}
		}
	case core.AllGather:
		for r := 0; r < world; r++ {
			for i := uintptr(0); i < count; i++ {
				if err := check(uintptr(r)*count+i, inputOf(r, i)); err != nil {
					return err
				}
			}
		}
	case core.ReduceScatter:
		per := count / uintptr(world)
		for i := uintptr(0); i < per; i++ {
			if err := check(i, reduce(uintptr(me)*per+i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func storeInt(dt core.DType, addr uintptr, v int) {
	if dt == core.Int32 {
		*(*int32)(unmanaged.Pointer(addr)) = int32(v)
		return
	}
	coll.StoreFloat(dt, addr, float32(v))
}

func loadInt(dt core.DType, addr uintptr) int {
	if dt == core.Int32 {
		return int(*(*int32)(unmanaged.Pointer(addr)))
	}
	return int(coll.LoadFloat(dt, addr))
}

// Every collective across machines against a reference, at sizes from one
// element to past the one-shot limit, every dtype and op.
func TestMachinesCollectives(t *testing.T) {
	for _, name := range []string{"2x2", "3x1"} {
		machines := layouts[name]
		t.Run(name, func(t *testing.T) {
			requireAllOK(t, runMachines(t, mmConfig{machines: machines, engine: "comm228"}, func(r *mmRank) error {
				g, h, _, err := r.join(4 << 20)
				if err != nil {
					return err
				}
				defer g.Destroy()
				defer h.Release()
				w := uintptr(r.world)
				call := 0
				for _, count := range []uintptr{w, 7 * w, 1000 * w, 20 * 1024 * w} {
					for _, dt := range []core.DType{core.Float32, core.Float16, core.BFloat16, core.Int32} {
						for _, kind := range []core.CollKind{core.AllReduce, core.AllGather, core.ReduceScatter} {
							for _, op := range []core.ReduceOp{core.OpSum, core.OpMax, core.OpMin} {
								if kind == core.AllGather && op != core.OpSum {
									continue
								}
								call++
								if err := collCheck(h, kind, dt, op, count, call); err != nil {
									return err
								}
							}
						}
					}
				}
				// Bad arguments are refused as on one machine.
				err = coll.Run(h, coll.Args{Kind: core.ReduceScatter, DType: core.Float32, Count: w + 1, Out: 16})
				if core.CodeOf(err) != core.ErrInvalidArgument {
					return fmt.Errorf("reduce_scatter of a count not a multiple of the world: %v", err)
				}
				return nil
			}))
		})
	}
}

// The hierarchical all-reduce (Note [Hierarchical all-reduce]) and the
// choice: every collective with algo hierarchical, auto (threshold
// lowered so that it picks hierarchical from a few KiB) and nccl, in place
// and out of place, at counts with and without a tail, against the
// reference; the split communicator made once by the first hierarchical
// call, by local rank, and closed with the group.
func TestMachinesHierarchical(t *testing.T) {
	defer func(v uintptr) { coll.HierMinBytes = v }(coll.HierMinBytes)
	coll.HierMinBytes = 4 << 10
	for _, name := range []string{"2x2", "3x1", "interleaved"} {
		machines := layouts[name]
		t.Run(name, func(t *testing.T) {
			var comms []*testComm
			var mu sync.Mutex
			requireAllOK(t, runMachines(t, mmConfig{machines: machines, engine: "comm"}, func(r *mmRank) error {
				mu.Lock()
				comms = append(comms, r.comm)
				mu.Unlock()
				g, h, _, err := r.join(4 << 20)
				if err != nil {
					return err
				}
				defer g.Destroy()
				defer h.Release()
				d := h.Symmetric()
				if d.Span == nil {
					return fmt.Errorf("rank %d: the handle's description has no span across machines", r.rank)
				}
				if team, bufs, pads := d.Span.Team, d.TeamBufferArray, d.TeamPadArray; bufs == 0 || pads != bufs+uintptr(8*len(team)) || len(team) != g.LocalSize() || team[g.LocalRank()] != r.rank {
					return fmt.Errorf("rank %d: team %v, team view arrays %#x %#x", r.rank, team, bufs, pads)
				}
				w := uintptr(r.world)
				call := 0
				for _, algo := range []core.Algo{core.AlgoHierarchical, core.AlgoAuto, core.AlgoNCCL} {
					for _, count := range []uintptr{1, 7, 8*w + 3, 1000*w + 5, 20 * 1024 * w} {
						for _, dt := range []core.DType{core.Float32, core.BFloat16, core.Int32} {
							for _, kind := range []core.CollKind{core.AllReduce, core.AllGather, core.ReduceScatter} {
								n := count
								if kind == core.ReduceScatter {
									n = (count + w - 1) / w * w
								}
								for _, inPlace := range []bool{false, true} {
									if inPlace && kind == core.ReduceScatter && n/w*dt.Size()%16 != 0 {
										continue // each rank's slice would not be 16-byte aligned
									}
									for _, op := range []core.ReduceOp{core.OpSum, core.OpMax} {
										if kind == core.AllGather && op != core.OpSum {
											continue
										}
										call++
										if err := collCheckAlgo(h, kind, dt, op, n, call, algo, inPlace); err != nil {
											return fmt.Errorf("%s, in place %v: %w", algo, inPlace, err)
										}
									}
								}
							}
						}
					}
				}
				// Out outside the block: hierarchical refuses, naming why;
				// auto hands the call to the engine.
				priv, err := r.a.Alloc(64<<10, 0)
				if err != nil {
					return err
				}
				defer r.a.Free(priv, 64<<10, 0)
				big := coll.Args{Kind: core.AllReduce, DType: core.Float32, Count: 8 << 10, Out: priv, Algo: core.AlgoHierarchical}
				if err := coll.Run(h, big); core.CodeOf(err) != core.ErrInvalidArgument || !strings.Contains(err.Error(), "inside the rendezvoused block") {
					return fmt.Errorf("hierarchical with out outside the block: %v", err)
				}
				big.Algo = core.AlgoAuto
				if err := coll.Run(h, big); err != nil {
					return fmt.Errorf("auto with out outside the block: %w", err)
				}
				// The handle outlives its group; the split went with the
				// group (Note [Collective state] in core/symm/coll).
				if err := g.Destroy(); err != nil {
					return err
				}
				in := coll.Args{Kind: core.AllReduce, DType: core.Float32, Count: 8 << 10, Algo: core.AlgoHierarchical}
				if err := coll.Run(h, in); core.CodeOf(err) != core.ErrInvalidState || !strings.Contains(err.Error(), "all_reduce with algo hierarchical: the group is destroyed: its communicator split by local rank is closed") {
					return fmt.Errorf("hierarchical after the group's destruction: %v", err)
				}
				return nil
			}))
			// One split (by local rank: one communicator per local rank),
			// every rank's communicator closed with its group.
			hubs, closes := comms[0].hub.splits()
			require.Equal(t, len(machines)/machinesIn(machines), hubs, "one split, a communicator per local rank")
			require.Equal(t, len(machines), closes, "every rank's split communicator closed")
		})
	}
}

// Ranks of one machine that call the hierarchical all-reduce with different
// arguments fail its step inside the machine with MISMATCH naming group
// ranks, before anything leaves the machine; the other machine's ranks,
// which agree, wait for them in NCCL and time out.
func TestMachinesHierarchicalMismatch(t *testing.T) {
	errs := runMachines(t, mmConfig{machines: layouts["2x2"], engine: "comm", timeout: 2 * time.Second}, func(r *mmRank) error {
		g, h, _, err := r.join(1 << 20)
		if err != nil {
			return err
		}
		defer g.Destroy()
		defer h.Release()
		op := core.OpSum
		if r.rank == 3 {
			op = core.OpMax
		}
		return coll.Run(h, coll.Args{Kind: core.AllReduce, DType: core.Float32, Op: op, Count: 4096, Algo: core.AlgoHierarchical})
	})
	requireAllFail(t, errs[2:], core.ErrMismatch, "ranks of the local team (ranks 2, 3,", "rank 0: reduce_scatter(float32, sum", "rank 1: reduce_scatter(float32, max")
	requireAllFail(t, errs[:2], core.ErrTimeout, "never arrived")
}

// machinesIn is the number of distinct machines of a layout.
func machinesIn(machines []int) int {
	seen := map[int]bool{}
	for _, m := range machines {
		seen[m] = true
	}
	return len(seen)
}

// Teams of different sizes: hierarchical is refused, naming the sizes;
// auto runs the call on the engine.
func TestMachinesHierarchicalUnevenTeams(t *testing.T) {
	defer func(v uintptr) { coll.HierMinBytes = v }(coll.HierMinBytes)
	coll.HierMinBytes = 0
	errs := runMachines(t, mmConfig{machines: []int{0, 0, 1}, engine: "comm"}, func(r *mmRank) error {
		g, h, _, err := r.join(1 << 20)
		if err != nil {
			return err
		}
		defer g.Destroy()
		defer h.Release()
		if err := collCheckAlgo(h, core.AllReduce, core.Float32, core.OpSum, 4096, 1, core.AlgoAuto, true); err != nil {
			return fmt.Errorf("auto: %w", err)
		}
		return collCheckAlgo(h, core.AllReduce, core.Float32, core.OpSum, 4096, 2, core.AlgoHierarchical, true)
	})
	requireAllFail(t, errs, core.ErrUnavailable, "teams of one size", "2, 1")
}

// Barriers and signals across machines: through the one-sided API where
// the communicator has it, else the barrier through an all-reduce and a
// remote signal UNAVAILABLE naming the NCCL version needed.
func TestMachinesBarrierAndSignals(t *testing.T) {
	for _, engine := range []string{"comm", "comm228"} {
		t.Run(engine, func(t *testing.T) {
			machines := layouts["2x2"]
			requireAllOK(t, runMachines(t, mmConfig{machines: machines, engine: engine}, func(r *mmRank) error {
				g, h, _, err := r.join(64 << 10)
				if err != nil {
					return err
				}
				defer g.Destroy()
				defer h.Release()
				// Values stored before a barrier are seen after it, round
				// after round, with each rank entering at another moment.
				for round := 0; round < 5; round++ {
					time.Sleep(time.Duration((r.rank*3+round)%4) * time.Millisecond)
					if err := localWrites(g, h, round); err != nil {
						return err
					}
				}
				remote := (r.rank + 2) % 4
				if engine == "comm228" {
					err := h.PutSignal(remote, 3, 0, 0)
					if core.CodeOf(err) != core.ErrUnavailable || !strings.Contains(err.Error(), "2.29") || !strings.Contains(err.Error(), "2.28.9") {
						return fmt.Errorf("a remote signal without the one-sided API: %v", err)
					}
					return nil
				}
				// Counting semaphores across machines: three signals, three waits.
				for i := 0; i < 3; i++ {
					if err := h.PutSignal(remote, 3, 0, 0); err != nil {
						return err
					}
				}
				for i := 0; i < 3; i++ {
					if err := h.WaitSignal(remote, 3, 0, 0); err != nil {
						return err
					}
				}
				return h.Barrier(2, 0, 0)
			}))
		})
	}
}

// A rank that never comes on another machine fails the others with
// ErrTimeout naming it and the machine, within the timeout.
func TestMachinesDeadRemoteRank(t *testing.T) {
	machines := layouts["2x2"]
	start := time.Now()
	errs := runMachines(t, mmConfig{machines: machines, engine: "comm228", timeout: 3 * time.Second}, func(r *mmRank) error {
		g, h, _, err := r.join(64 << 10)
		if err != nil {
			return err
		}
		defer g.Destroy()
		defer h.Release()
		if r.rank == 3 {
			return nil // gone: it never makes the collective
		}
		return coll.Run(h, coll.Args{Kind: core.AllReduce, DType: core.Float32, Count: 64})
	})
	require.Less(t, time.Since(start), 15*time.Second)
	require.NoError(t, errs[3])
	for r := 0; r < 3; r++ {
		require.Equal(t, core.ErrTimeout, core.CodeOf(errs[r]), "rank %d: %v", r, errs[r])
		require.Contains(t, errs[r].Error(), "rank(s) 3 never arrived")
		if r < 2 {
			require.Contains(t, errs[r].Error(), `rank(s) 2, 3 on machine "m1"`)
		}
	}
}

// pause_group on a group that spans machines: each machine drops and remakes
// its local mappings, the NCCL windows are deregistered before the memory
// goes and registered again, collectively, by the resume; afterwards local
// writes, the contents (backed up) and collectives across machines work.
func TestMachinesPauseResume(t *testing.T) {
	for _, name := range []string{"2x2", "3x1"} {
		machines := layouts[name]
		t.Run(name, func(t *testing.T) {
			tag := "mm-pause-" + name
			id, err := alloc.RegisterTag(tag, alloc.BackupPinned)
			require.NoError(t, err)
			requireAllOK(t, runMachines(t, mmConfig{machines: machines, engine: "comm"}, func(r *mmRank) error {
				g, h, buf, err := r.joinTagged(pauseBlock, id)
				if err != nil {
					return err
				}
				defer g.Destroy()
				defer h.Release()
				mark := words(buf, pauseBlock/8)
				for i := r.world; i < len(mark); i += 4096 {
					mark[i] = uint64(r.rank)<<32 | uint64(i)
				}
				for cycle := 0; cycle < 2; cycle++ {
					reg, dereg, _ := g.WindowCounts()
					win, _, _ := h.Window()
					if win == 0 {
						return fmt.Errorf("cycle %d: no window before the pause", cycle)
					}
					if err := localWrites(g, h, 10*cycle); err != nil {
						return err
					}
					if err := g.Pause(tag); err != nil {
						return err
					}
					if w, _, err := h.Window(); w != 0 || core.CodeOf(err) != core.ErrInvalidState {
						return fmt.Errorf("cycle %d: the window %#x outlived the paused memory (%v)", cycle, w, err)
					}
					if _, d, live := g.WindowCounts(); d != dereg+1 || live != 0 {
						return fmt.Errorf("cycle %d: paused: %d deregistered (want %d), %d live", cycle, d, dereg+1, live)
					}
					if err := g.Resume(tag); err != nil {
						return err
					}
					if rg, _, live := g.WindowCounts(); rg != reg+1 || live != 1 {
						return fmt.Errorf("cycle %d: resumed: %d registered (want %d), %d live", cycle, rg, reg+1, live)
					}
					if w, _, err := h.Window(); w == 0 || err != nil {
						return fmt.Errorf("cycle %d: no window after the resume", cycle)
					}
					for i := r.world; i < len(mark); i += 4096 {
						if mark[i] != uint64(r.rank)<<32|uint64(i) {
							return fmt.Errorf("cycle %d: word %d of our block is %#x after the resume", cycle, i, mark[i])
						}
					}
					if err := localWrites(g, h, 10*cycle+1); err != nil {
						return err
					}
					// A rendezvous on the resumed segment registers nothing.
					h2, err := g.Rendezvous(buf)
					if err != nil {
						return err
					}
					h2.Release()
					if rg, _, _ := g.WindowCounts(); rg != reg+1 {
						return fmt.Errorf("cycle %d: a rendezvous after the resume registered again", cycle)
					}
				}
				if err := collCheck(h, core.AllReduce, core.Float32, core.OpSum, uintptr(64*r.world), 1); err != nil {
					return err
				}
				return h.Barrier(0, 0, 0)
			}))
		})
	}
}

// fabricHost is the host backend with fabric handles, for the tests of
// Note [Fabric teams]: a handle names the memory's memfd as
// /proc/<pid>/fd/<n>, which an importer opens (the ranks of a test share
// the process, so every handle is reachable), and the device's domain is
// whatever the test says.
type fabricHost struct {
	*host.Backend
	domain string
}

func (b *fabricHost) FabricDomain(dev int) (string, string, error) {
	if b.domain == "" {
		return "", "no fabric domain in this test", nil
	}
	return b.domain, "", nil
}

func (b *fabricHost) ExportFabric(m core.Memory) ([]byte, error) {
	h := make([]byte, 64)
	copy(h, fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(m)))
	return h, nil
}

func (b *fabricHost) ImportFabric(dev int, h []byte) (core.Memory, error) {
	fd, err := unix.Open(strings.TrimRight(string(h), "\x00"), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, core.Errorf(core.ErrBackend, "opening the fabric handle %q: %v", h, err)
	}
	return b.Backend.Import(dev, fd)
}

// Ranks on two machines of one NVLink domain form one team: they map each
// other through fabric handles, ranks of one machine through descriptors;
// a third machine outside the domain stays remote. Pause and resume remap
// every peer of the team.
func TestMachinesFabricTeam(t *testing.T) {
	machines := []int{0, 0, 1, 1, 2}
	domains := []string{"rack-a/1", "rack-a/1", "rack-a/1", "rack-a/1", ""}
	tag := "mm-fabric"
	id, err := alloc.RegisterTag(tag, alloc.BackupPinned)
	require.NoError(t, err)
	requireAllOK(t, runMachines(t, mmConfig{machines: machines, engine: "comm",
		backend: func(r int, be *host.Backend) core.Backend { return &fabricHost{Backend: be, domain: domains[r]} },
	}, func(r *mmRank) error {
		g, h, _, err := r.joinTagged(pauseBlock, id)
		if err != nil {
			return err
		}
		defer g.Destroy()
		defer h.Release()
		team := []int{0, 1, 2, 3}
		if r.rank == 4 {
			team = []int{4}
		}
		if g.LocalSize() != len(team) || g.Machines() != 3 || !g.fabricSpan {
			return fmt.Errorf("rank %d: local size %d, %d machines, fabric span %v", r.rank, g.LocalSize(), g.Machines(), g.fabricSpan)
		}
		if got, want := h.MappedPeers(), len(team)-1; got != want {
			return fmt.Errorf("rank %d: %d mapped peers, want %d", r.rank, got, want)
		}
		for round := 0; round < 2; round++ {
			if err := localWrites(g, h, round); err != nil {
				return err
			}
			if err := g.Pause(tag); err != nil {
				return err
			}
			if err := g.Resume(tag); err != nil {
				return err
			}
		}
		// Local writes after the resume reach every peer of the team again.
		if err := localWrites(g, h, 7); err != nil {
			return err
		}
		return collCheck(h, core.AllReduce, core.Int32, core.OpMax, uintptr(16*r.world), 3)
	}))
}

// A resume whose all-gather of fabric handles fails leaves every peer it
// had already mapped again through descriptors paused, as the failed
// verdict does: nothing of the peers' memory stays mapped under a pause.
func TestMachinesFabricResumeGatherFails(t *testing.T) {
	machines := []int{0, 0, 1, 1, 2}
	domains := []string{"rack-a/1", "rack-a/1", "rack-a/1", "rack-a/1", ""}
	tag := "mm-fabric-fail"
	id, err := alloc.RegisterTag(tag, alloc.BackupPinned)
	require.NoError(t, err)
	errs := runMachines(t, mmConfig{machines: machines, engine: "allgather", timeout: 3 * time.Second,
		backend: func(r int, be *host.Backend) core.Backend { return &fabricHost{Backend: be, domain: domains[r]} },
	}, func(r *mmRank) error {
		var armed atomic.Bool
		if r.rank == 4 {
			// Rank 4 fails its part of the resume's fabric all-gather,
			// so the others' all-gather times out waiting for it.
			gather := r.o.AllGather
			r.o.AllGather = func(send, recv []byte) error {
				if armed.Load() && len(send) > 2 && send[0] == recordVersion && send[1] == recFabric {
					return core.Errorf(core.ErrBackend, "injected failure of the fabric all-gather")
				}
				return gather(send, recv)
			}
		}
		g, h, _, err := r.joinTagged(pauseBlock, id)
		if err != nil {
			return err
		}
		defer g.Destroy()
		defer h.Release()
		if err := g.Pause(tag); err != nil {
			return err
		}
		armed.Store(true)
		if err := g.Resume(tag); err == nil {
			return fmt.Errorf("rank %d: the resume succeeded without rank 4's fabric all-gather", r.rank)
		}
		return g.gm.peers.each(func(k mapKey, m *peerMap) error {
			if !m.paused || m.mem != 0 {
				return fmt.Errorf("rank %d: rank %d's segment at heap offset %#x is mapped (memory %d) after the failed resume", r.rank, k.peer, k.heapOff, m.mem)
			}
			return nil
		})
	})
	requireAllOK(t, errs)
}

// each calls f on every mapping of the table, under its lock, until f
// fails.
func (t *peerMappings) each(f func(k mapKey, m *peerMap) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, m := range t.maps {
		if err := f(k, m); err != nil {
			return err
		}
	}
	return nil
}
