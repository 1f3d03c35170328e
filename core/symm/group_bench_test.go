package symm

// Group creation and rendezvous on one machine, in one process (one
// goroutine and runtime per rank), through the sockets and through a
// caller's all-gather: go test -run '^$' -bench Group ./core/symm

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/host"
)

// benchGather is an in-process all-gather: call n of every rank meets in
// one slot.
type benchGather struct {
	world int
	mu    sync.Mutex
	cond  *sync.Cond
	calls map[int]*benchRound
}

type benchRound struct {
	parts [][]byte
	n     int
	done  int
}

func (b *benchGather) fn(rank int) func(send, recv []byte) error {
	call := 0
	return func(send, recv []byte) error {
		call++
		b.mu.Lock()
		defer b.mu.Unlock()
		r := b.calls[call]
		if r == nil {
			r = &benchRound{parts: make([][]byte, b.world)}
			b.calls[call] = r
		}
		r.parts[rank] = append([]byte(nil), send...)
		r.n++
		b.cond.Broadcast()
		for r.n < b.world {
			b.cond.Wait()
		}
		for q, p := range r.parts {
			copy(recv[q*len(send):], p)
		}
		if r.done++; r.done == b.world {
			delete(b.calls, call)
		}
		return nil
	}
}

func benchGroups(b *testing.B, world int, gather bool) {
	dir := sockDir(b)
	rts := make([]*alloc.Runtime, world)
	bufs := make([]uintptr, world)
	for r := range rts {
		be, err := host.New()
		if err != nil {
			b.Fatal(err)
		}
		rts[r] = alloc.NewRuntime(be)
		a, _ := rts[r].Allocator(0)
		bufs[r], _ = a.Alloc(1<<20, 0)
	}
	var create, rdv time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		bg := &benchGather{world: world, calls: map[int]*benchRound{}}
		bg.cond = sync.NewCond(&bg.mu)
		var wg sync.WaitGroup
		errs := make([]error, world)
		times := make([][2]time.Duration, world)
		for r := 0; r < world; r++ {
			wg.Add(1)
			go func(r int) {
				defer wg.Done()
				o := Options{Name: fmt.Sprintf("bench-%d", i), Rank: r, World: world, Timeout: 20 * time.Second, Runtime: rts[r], SocketDir: dir, JobToken: "bench"}
				if gather {
					o.AllGather = bg.fn(r)
				}
				t0 := time.Now()
				g, err := New(o)
				if err != nil {
					errs[r] = err
					return
				}
				t1 := time.Now()
				h, err := g.Rendezvous(bufs[r])
				times[r] = [2]time.Duration{t1.Sub(t0), time.Since(t1)}
				if err == nil {
					h.Release()
				}
				errs[r] = err
				g.Destroy()
			}(r)
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		create += max(times[0][0], times[world-1][0])
		rdv += max(times[0][1], times[world-1][1])
	}
	b.ReportMetric(float64(create.Microseconds())/float64(b.N), "create-us")
	b.ReportMetric(float64(rdv.Microseconds())/float64(b.N), "rendezvous-us")
}

func BenchmarkGroupSockets2(b *testing.B) { benchGroups(b, 2, false) }
func BenchmarkGroupSockets4(b *testing.B) { benchGroups(b, 4, false) }
func BenchmarkGroupGather2(b *testing.B)  { benchGroups(b, 2, true) }
func BenchmarkGroupGather4(b *testing.B)  { benchGroups(b, 4, true) }

// benchRendezvousAgain times a rendezvous again on the same buffer (and
// the handle's release), every rank in a loop: the ranks pace each other
// through the record all-gather.
func benchRendezvousAgain(b *testing.B, world int) {
	dir := sockDir(b)
	groups := make([]*Group, world)
	first := make([]*Handle, world) // held throughout, as a program holds its handle
	bufs := make([]uintptr, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		be, err := host.New()
		if err != nil {
			b.Fatal(err)
		}
		rt := alloc.NewRuntime(be)
		a, _ := rt.Allocator(0)
		bufs[r], _ = a.Alloc(1<<20, 0)
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			groups[r], errs[r] = New(Options{Name: "bench-again", Rank: r, World: world, Timeout: 20 * time.Second, Runtime: rt, SocketDir: dir, JobToken: "bench"})
			if errs[r] == nil {
				first[r], errs[r] = groups[r].Rendezvous(bufs[r])
			}
		}(r)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for i := 0; i < b.N && errs[r] == nil; i++ {
				var h *Handle
				if h, errs[r] = groups[r].Rendezvous(bufs[r]); errs[r] == nil {
					h.Release()
				}
			}
		}(r)
	}
	wg.Wait()
	b.StopTimer()
	for r, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
		first[r].Release()
		groups[r].Destroy()
	}
}

// BenchmarkRendezvousAgain1 is a rank's own work alone: its all-gather
// waits for nobody.
func BenchmarkRendezvousAgain1(b *testing.B) { benchRendezvousAgain(b, 1) }
func BenchmarkRendezvousAgain2(b *testing.B) { benchRendezvousAgain(b, 2) }
func BenchmarkRendezvousAgain4(b *testing.B) { benchRendezvousAgain(b, 4) }

// BenchmarkRendezvousRecords4 is the record work of a rendezvous of 4
// ranks: ours encoded, every rank's decoded, the verdict.
func BenchmarkRendezvousRecords4(b *testing.B) {
	const world = 4
	rec := blockRecord{blockSize: 1 << 20, requested: 1 << 20, heapOff: 0x2000, segSize: 2 << 20, segID: 3, allocs: 5, frees: 1,
		padSize: 4096, padsReady: true, held: []uint64{0, 4, 4, 4}}
	var sc rendezvousScratch
	sc.reset(world)
	c := rendezvousCall{g: &Group{name: "bench", world: world}, recs: sc.recs}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		sc.enc = rec.appendTo(sc.enc[:0])
		for r := 0; r < world; r++ {
			if err := decodeBlockInto(&sc.recs[r], sc.enc, world, sc.held[r*world:(r+1)*world]); err != nil {
				b.Fatal(err)
			}
		}
		if err := c.check(); err != nil {
			b.Fatal(err)
		}
	}
}
