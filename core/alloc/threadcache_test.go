package alloc_test

import (
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/host"
	"github.com/stretchr/testify/require"
)

// goBin is a thread cache in Go with the fast path of export/tcache.c
// (Note [Thread caches] in threadcache.go): what the core sees of a bin is
// the same, so the core's side is tested here and the C side by
// tests/c/test_tcache.c.
type goBin struct {
	mu         sync.Mutex
	e          []alloc.CacheEntry
	p          alloc.CachePending
	dead       bool
	registered bool
}

const goBinCap = 8 // small, so that full bins are exercised

func (b *goBin) Lock()                        { b.mu.Lock() }
func (b *goBin) Unlock()                      { b.mu.Unlock() }
func (b *goBin) Len() int                     { return len(b.e) }
func (b *goBin) Cap() int                     { return goBinCap }
func (b *goBin) Entry(i int) alloc.CacheEntry { return b.e[i] }
func (b *goBin) Remove(i int)                 { b.e = append(b.e[:i], b.e[i+1:]...) }
func (b *goBin) Push(e alloc.CacheEntry)      { b.e = append(b.e, e) }
func (b *goBin) Dead() bool                   { return b.dead }
func (b *goBin) Register()                    { b.registered = true }
func (b *goBin) Retire()                      { b.registered = false }
func (b *goBin) TakePending() alloc.CachePending {
	p := b.p
	b.p = alloc.CachePending{}
	return p
}

func roundRequest(n uintptr) uintptr {
	if n == 0 {
		return 512
	}
	return (n + 511) &^ 511
}

func (b *goBin) count(size, requested uintptr, sign int64) {
	pool := 2
	if size <= 1<<20 {
		pool = 1
	}
	v := [alloc.NumPending]int64{1, int64(size), int64(requested)}
	for q := range v {
		for _, p := range []int{0, pool} {
			b.p.Net[q][p] += sign * v[q]
			if sign > 0 {
				b.p.Hits[q][p] += v[q]
				b.p.High[q][p] = max(b.p.High[q][p], b.p.Net[q][p])
			}
		}
	}
}

// hit is the fast path of symmem_alloc: the newest available block of the
// size and stream, or 0.
func (b *goBin) hit(size uintptr, s core.Stream) uintptr {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dead {
		panic("a dead thread allocates")
	}
	r := roundRequest(size)
	for i := len(b.e) - 1; i >= 0; i-- {
		if e := &b.e[i]; !e.Out && e.Size == r && e.Stream == s {
			e.Out, e.Requested = true, size
			b.count(r, size, 1)
			return e.Addr
		}
	}
	return 0
}

// undo is the fast path of symmem_free: true when it took p back.
func (b *goBin) undo(p, size uintptr) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(b.e) - 1; i >= 0; i-- {
		e := b.e[i]
		if e.Addr != p {
			continue
		}
		if !e.Out || (size != 0 && size != e.Requested) {
			return false // for the core to report
		}
		b.count(e.Size, e.Requested, -1)
		b.e = append(b.e[:i], b.e[i+1:]...)
		e.Out, e.Requested = false, 0
		b.e = append(b.e, e)
		return true
	}
	return false
}

// tcAllocator is an allocator on the host backend, whatever SYMMEM_BACKEND
// says: these tests use made-up stream handles (record_stream makes the
// backend wait on them), and the thread caches' logic is the core's alone.
func tcAllocator(t testing.TB) *alloc.Allocator {
	hb, err := host.New()
	require.NoError(t, err)
	return newAllocator(t, hb)
}

// thread is one caller: its bin (nil: caches off) and how it calls.
type thread struct {
	a   *alloc.Allocator
	bin *goBin
}

func (th thread) alloc(size uintptr, s core.Stream) (uintptr, error) {
	if th.bin != nil && size <= alloc.MaxCachedBlock {
		if p := th.bin.hit(size, s); p != 0 {
			return p, nil
		}
	}
	return th.a.Alloc(size, s)
}

func (th thread) free(p, size uintptr, s core.Stream) error {
	if th.bin == nil {
		return th.a.FreeTo(p, size, s, nil)
	}
	if th.bin.undo(p, size) {
		return nil
	}
	return th.a.FreeTo(p, size, s, th.bin)
}

// userStats are the statistics that do not depend on placement.
func userStats(t testing.TB, a *alloc.Allocator) map[string]int64 {
	out := map[string]int64{}
	for _, s := range a.Stats() {
		for _, k := range []string{"allocation.", "active.", "allocated_bytes.", "active_bytes.", "requested_bytes."} {
			if strings.HasPrefix(s.Key, k) {
				out[s.Key] = s.Value
			}
		}
	}
	require.Len(t, out, 5*3*4)
	return out
}

type tcOp struct {
	kind   int // 0 alloc, 1 free, 2 record_stream+free, 3 empty_cache, 4 limit, 5 double free, 6 free an interior pointer
	size   uintptr
	stream core.Stream
	pick   int
}

func tcOps(seed int64, n int) []tcOp {
	r := rand.New(rand.NewSource(seed))
	sizes := []uintptr{0, 1, 512, 700, 4096, 65536, 1 << 20, 3 << 20, 12 << 20}
	ops := make([]tcOp, n)
	for i := range ops {
		k := r.Intn(100)
		op := tcOp{size: sizes[r.Intn(len(sizes))], stream: core.Stream(r.Intn(2)), pick: r.Int()}
		switch {
		case k < 50:
			op.kind = 0
		case k < 88:
			op.kind = 1
		case k < 92:
			op.kind = 2
		case k < 94:
			op.kind = 3
		case k < 96:
			op.kind = 4
		case k < 98:
			op.kind = 5
		default:
			op.kind = 6
		}
		ops[i] = op
	}
	return ops
}

type live struct {
	p, size uintptr
	s       core.Stream
}

// runTC runs ops as one thread; check (optional) is called after each op.
// It returns every pointer the allocations returned, as heap offsets.
func runTC(t *testing.T, th thread, ops []tcOp, check func(i int)) []uint64 {
	var held []live
	var freed []uintptr
	var offs []uint64
	for i, op := range ops {
		func() { // returns early to skip an op; check runs after every op
			switch op.kind {
			case 0:
				p, err := th.alloc(op.size, op.stream)
				require.NoError(t, err, "op %d", i)
				info, err := th.a.Lookup(p)
				require.NoError(t, err)
				offs = append(offs, info.HeapOff)
				held = append(held, live{p, op.size, op.stream})
			case 1, 2:
				if len(held) == 0 {
					return
				}
				j := op.pick % len(held)
				h := held[j]
				held = append(held[:j], held[j+1:]...)
				if op.kind == 2 {
					require.NoError(t, th.a.RecordStream(h.p, 7))
				}
				require.NoError(t, th.free(h.p, h.size, h.s), "op %d", i)
				freed = append(freed, h.p)
			case 3:
				require.NoError(t, th.a.EmptyCache())
			case 4:
				th.a.SetLimit(uint64(1 << 30))
			case 5, 6:
				if len(freed) == 0 {
					return
				}
				p := freed[op.pick%len(freed)]
				still := false
				for _, h := range held {
					still = still || h.p == p
				}
				if still {
					return // reallocated since: not a double free
				}
				if op.kind == 6 {
					p += 256 // inside the block, never another block's start
				}
				err := th.free(p, 0, 0)
				require.Error(t, err)
				require.Equal(t, core.ErrInvalidPointer, core.CodeOf(err), "%v", err)
			}
		}()
		if check != nil {
			check(i)
		}
	}
	for _, h := range held {
		require.NoError(t, th.free(h.p, h.size, h.s))
	}
	return offs
}

// TestThreadCacheKeepsUserStatisticsExact: one thread's random calls with a
// cache and without give the same placement-independent statistics after
// every call (peaks included), and both allocators stay valid.
func TestThreadCacheKeepsUserStatisticsExact(t *testing.T) {
	for seed := int64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			ops := tcOps(seed, 600)
			on := thread{tcAllocator(t), &goBin{}}
			off := thread{tcAllocator(t), nil}
			var want []map[string]int64
			runTC(t, off, ops, func(i int) {
				want = append(want, userStats(t, off.a))
				require.NoError(t, off.a.Validate(), "op %d", i)
			})
			hits := 0
			runTC(t, on, ops, func(i int) {
				require.Equal(t, want[i], userStats(t, on.a), "op %d (%+v)", i, ops[i])
				require.NoError(t, on.a.Validate(), "op %d", i)
				if stat(t, on.a, "thread_cache.all.current") > 0 {
					hits++
				}
			})
			require.Greater(t, hits, 0, "the cache was used")
			require.NoError(t, on.a.EmptyCache())
			require.Zero(t, stat(t, on.a, "thread_cache_bytes.all.current"), "empty_cache drains every bin")
			require.Zero(t, stat(t, on.a, "reserved_bytes.all.current"), "and then releases every segment")
			require.Zero(t, on.bin.Len())
		})
	}
}

// TestThreadCachePlacementIsAPureFunctionOfTheThreadsCalls: the same calls
// twice with a cache give the same heap offsets; with the cache on, a
// thread gets back the block it freed last (not the best fit).
func TestThreadCachePlacementIsAPureFunctionOfTheThreadsCalls(t *testing.T) {
	ops := tcOps(11, 800)
	first := runTC(t, thread{tcAllocator(t), &goBin{}}, ops, nil)
	second := runTC(t, thread{tcAllocator(t), &goBin{}}, ops, nil)
	require.Equal(t, first, second)

	for _, cached := range []bool{false, true} {
		th := thread{tcAllocator(t), nil}
		if cached {
			th.bin = &goBin{}
		}
		a, err := th.alloc(512, 0)
		require.NoError(t, err)
		b, err := th.alloc(512, 0)
		require.NoError(t, err)
		require.Less(t, a, b)
		require.NoError(t, th.free(a, 512, 0))
		require.NoError(t, th.free(b, 512, 0))
		c, err := th.alloc(512, 0)
		require.NoError(t, err)
		if cached {
			require.Equal(t, b, c, "the newest block of the thread's bin")
		} else {
			require.Equal(t, a, c, "the best fit, lowest address")
		}
		require.NoError(t, th.free(c, 512, 0))
	}
}

// TestThreadCachesUnderConcurrency: several threads with bins allocate,
// free their own and each other's blocks, record streams, empty the cache,
// set limits, read statistics and validate; some exit with full bins (marked
// dead, adopted by the next call). At the end every count is zero.
func TestThreadCachesUnderConcurrency(t *testing.T) {
	a := tcAllocator(t)
	const threads = 6
	var mu sync.Mutex
	var shared []live // blocks any thread may free
	var wg sync.WaitGroup
	errs := make(chan error, threads)
	for g := 0; g < threads; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			th := thread{a, &goBin{}}
			r := rand.New(rand.NewSource(int64(g)))
			var mine []live
			fail := func(err error) bool {
				if err != nil {
					errs <- fmt.Errorf("thread %d: %w", g, err)
					return true
				}
				return false
			}
			for i := 0; i < 1500; i++ {
				switch k := r.Intn(100); {
				case k < 45:
					size := []uintptr{512, 1000, 4096, 1 << 20, 2 << 20}[r.Intn(5)]
					p, err := th.alloc(size, core.Stream(r.Intn(2)))
					if core.CodeOf(err) == core.ErrOutOfMemory {
						continue // under a small limit
					}
					if fail(err) {
						return
					}
					mine = append(mine, live{p, size, 0})
				case k < 80 && len(mine) > 0:
					j := r.Intn(len(mine))
					h := mine[j]
					mine = append(mine[:j], mine[j+1:]...)
					if r.Intn(5) == 0 { // to another thread
						mu.Lock()
						shared = append(shared, h)
						mu.Unlock()
						continue
					}
					if fail(th.free(h.p, h.size, 0)) {
						return
					}
				case k < 88:
					mu.Lock()
					var h live
					if n := len(shared); n > 0 {
						h, shared = shared[n-1], shared[:n-1]
					}
					mu.Unlock()
					if h.p != 0 {
						if r.Intn(3) == 0 {
							if fail(a.RecordStream(h.p, 9)) {
								return
							}
						}
						if fail(th.free(h.p, h.size, 0)) {
							return
						}
					}
				case k < 90:
					if fail(a.EmptyCache()) {
						return
					}
				case k < 92:
					a.SetLimit(uint64([]int{0, 64 << 20}[r.Intn(2)]))
				case k < 96:
					if fail(a.Validate()) {
						return
					}
				default:
					s := userStats(t, a)
					if s["allocation.all.current"] < 0 || s["allocated_bytes.all.peak"] < s["allocated_bytes.all.current"] {
						fail(fmt.Errorf("statistics %v", s))
						return
					}
				}
			}
			for _, h := range mine {
				if fail(th.free(h.p, h.size, 0)) {
					return
				}
			}
			// The thread exits with its bin as it is: marked dead, never
			// called into again.
			th.bin.Lock()
			th.bin.dead = true
			th.bin.Unlock()
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	a.SetLimit(0)
	for _, h := range shared {
		require.NoError(t, a.Free(h.p, h.size, 0))
	}
	require.NoError(t, a.Validate())
	require.Zero(t, stat(t, a, "allocation.all.current"))
	require.Zero(t, stat(t, a, "requested_bytes.all.current"))
	require.Zero(t, stat(t, a, "thread_cache.all.current"), "dead bins were adopted")
	require.Equal(t, stat(t, a, "allocation.all.allocated"), stat(t, a, "allocation.all.freed"))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, stat(t, a, "reserved_bytes.all.current"))
}

// TestThreadCacheDoubleFreesAndForeignThreads: a block in one thread's bin
// freed again, by that thread or another, is a double free; a block another
// thread's hit handed out (not yet synced) is freed correctly by any thread.
func TestThreadCacheDoubleFreesAndForeignThreads(t *testing.T) {
	a := tcAllocator(t)
	t1, t2 := thread{a, &goBin{}}, thread{a, &goBin{}}
	p, err := t1.alloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, t1.free(p, 4096, 0))
	require.Equal(t, int64(1), stat(t, a, "thread_cache.all.current"))
	for _, th := range []thread{t1, t2} {
		err := th.free(p, 4096, 0)
		require.Equal(t, core.ErrInvalidPointer, core.CodeOf(err))
		require.Contains(t, err.Error(), "not allocated: already freed (double free?)")
	}
	_, err = a.Lookup(p)
	require.Equal(t, core.ErrInvalidPointer, core.CodeOf(err), "a cached block is not allocated for the user")
	require.Equal(t, core.ErrInvalidPointer, core.CodeOf(a.RecordStream(p, 3)))

	q, err := t1.alloc(4096, 0) // a hit, not synced yet
	require.NoError(t, err)
	require.Equal(t, p, q)
	require.NoError(t, t2.free(q, 4096, 0), "the core syncs t1's bin first")
	require.Equal(t, int64(1), stat(t, a, "thread_cache.all.current"), "now in t2's bin")
	require.Zero(t, t1.bin.Len())
	require.Equal(t, 1, t2.bin.Len())
	require.Zero(t, stat(t, a, "allocation.all.current"))
	require.Equal(t, int64(2), stat(t, a, "allocation.all.allocated"))
	require.NoError(t, a.Validate())

	// A size that differs from the request: the block is freed anyway and
	// the error says so, as without a cache.
	r, err := t2.alloc(4096, 0)
	require.NoError(t, err)
	err = t2.free(r, 100, 0)
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
	require.Zero(t, stat(t, a, "allocation.all.current"))
	require.NoError(t, a.Validate())
}

// TestThreadCacheLeavesHistoryAndRecordedStreamsAlone: blocks with
// recorded streams never enter a bin, and turning history on drains bins.
func TestThreadCacheLeavesHistoryAndRecordedStreamsAlone(t *testing.T) {
	a := tcAllocator(t)
	th := thread{a, &goBin{}}
	p, err := th.alloc(512, 0)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, 5))
	require.NoError(t, th.free(p, 512, 0))
	require.Zero(t, th.bin.Len())
	p, err = th.alloc(512, 0)
	require.NoError(t, err)
	require.NoError(t, th.free(p, 512, 0))
	require.Equal(t, 1, th.bin.Len())
	a.SetHistory(100)
	defer a.SetHistory(0)
	require.Zero(t, th.bin.Len(), "recording drains the bins")
	p, err = th.alloc(512, 0)
	require.NoError(t, err)
	require.NoError(t, th.free(p, 512, 0))
	require.Zero(t, th.bin.Len(), "and keeps them empty")
	_, ev := a.Snapshot()
	require.Len(t, ev, 3, "alloc, free_requested, free_completed: all recorded")
}

// TestThreadCacheGivesBlocksBackBeforeNewSegments: under a memory limit, a
// request that no free block fits first takes back the bins' blocks; when
// one of them then fits, no segment is released or made.
func TestThreadCacheGivesBlocksBackBeforeNewSegments(t *testing.T) {
	a := tcAllocator(t)
	th := thread{a, &goBin{}}
	p, err := th.alloc(1<<20, 0)
	require.NoError(t, err)
	q, err := th.alloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, th.free(p, 1<<20, 0))
	require.NoError(t, th.free(q, 1<<20, 0))
	require.Equal(t, int64(2<<20), stat(t, a, "thread_cache_bytes.all.current"))
	a.SetLimit(2 << 20)
	made, released := stat(t, a, "num_device_alloc"), stat(t, a, "num_device_free")
	r, err := th.alloc(1<<20-512, 0) // another size: no hit
	require.NoError(t, err)
	require.Equal(t, p, r, "the merged blocks of the drained bin serve it")
	require.Equal(t, made, stat(t, a, "num_device_alloc"))
	require.Equal(t, released, stat(t, a, "num_device_free"))
	require.Zero(t, stat(t, a, "thread_cache.all.current"))
	require.NoError(t, th.free(r, 0, 0))
	require.NoError(t, a.Validate())
}

// FuzzThreadCache: any sequence of calls gives the same placement-
// independent statistics with a thread cache and without, after every call,
// and both allocators stay valid (`make fuzz` runs it after FuzzAllocFree).
func FuzzThreadCache(f *testing.F) {
	f.Add([]byte{0, 2, 0, 0, 2, 0, 1, 0, 0, 0, 3, 1, 5, 0, 0})
	f.Add([]byte{0, 7, 1, 0, 7, 1, 1, 0, 1, 2, 0, 0, 3, 0, 0, 6, 0, 0})
	sizes := []uintptr{0, 1, 512, 700, 4096, 65536, 1 << 20, 3 << 20, 12 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ops []tcOp
		for i := 0; i+2 < len(data) && len(ops) < 200; i += 3 {
			ops = append(ops, tcOp{kind: int(data[i] % 7), size: sizes[int(data[i+1])%len(sizes)],
				stream: core.Stream(data[i+1] / 128), pick: int(data[i+2])})
		}
		on := thread{tcAllocator(t), &goBin{}}
		off := thread{tcAllocator(t), nil}
		var want []map[string]int64
		runTC(t, off, ops, func(int) { want = append(want, userStats(t, off.a)) })
		runTC(t, on, ops, func(i int) {
			require.Equal(t, want[i], userStats(t, on.a), "op %d (%+v)", i, ops[i])
			require.NoError(t, on.a.Validate(), "op %d", i)
		})
	})
}

// TestThreadCacheLargeBlocksDoNotGrowTheReserve: a large block waiting in a
// bin goes back to the pools before a large request of another size maps a
// new segment, so the reserve grows no more than without caches.
func TestThreadCacheLargeBlocksDoNotGrowTheReserve(t *testing.T) {
	for _, caches := range []bool{false, true} {
		a := tcAllocator(t)
		th := thread{a, nil}
		if caches {
			th.bin = &goBin{}
		}
		p, err := th.alloc(64<<20, 0)
		require.NoError(t, err)
		require.NoError(t, th.free(p, 64<<20, 0))
		if caches {
			require.Equal(t, int64(64<<20), stat(t, a, "thread_cache_bytes.all.current"), "a 64 MiB block is cached")
		}
		reserved := stat(t, a, "reserved_bytes.all.current")
		q, err := th.alloc(40<<20, 0) // another size: no hit
		require.NoError(t, err)
		require.Equal(t, reserved, stat(t, a, "reserved_bytes.all.current"), "caches %v: the 64 MiB segment serves 40 MiB", caches)
		require.Equal(t, p, q)
		require.NoError(t, th.free(q, 0, 0))
		require.NoError(t, a.Validate())
	}
}

// A large request that misses its own thread's bin sees the blocks that
// other threads' bins hold before it chooses a free block: thread B's
// 64 MiB takes the 64 MiB block that thread A freed into its bin rather than
// splitting a free 100 MiB block, so a 100 MiB request after it fits
// without growing the reserve, as it would without the caches (the
// backward pass frees on another thread than the forward pass allocates).
func TestThreadCacheLargeMissSeesOtherThreadsBlocks(t *testing.T) {
	for _, caches := range []bool{false, true} {
		a := tcAllocator(t)
		ta, tb, none := thread{a, nil}, thread{a, nil}, thread{a, nil}
		if caches {
			ta.bin, tb.bin = &goBin{}, &goBin{}
		}
		p64, err := ta.alloc(64<<20, 0)
		require.NoError(t, err)
		p100, err := tb.alloc(100<<20, 0)
		require.NoError(t, err)
		require.NoError(t, ta.free(p64, 64<<20, 0))
		require.NoError(t, none.free(p100, 100<<20, 0))
		reserved := stat(t, a, "reserved_bytes.all.current")

		q64, err := tb.alloc(64<<20, 0)
		require.NoError(t, err)
		require.Equal(t, p64, q64, "caches %v: the 64 MiB request takes the 64 MiB block", caches)
		q100, err := tb.alloc(100<<20, 0)
		require.NoError(t, err)
		require.Equal(t, p100, q100, "caches %v: the 100 MiB block is whole", caches)
		require.Equal(t, reserved, stat(t, a, "reserved_bytes.all.current"), "caches %v: the reserve did not grow", caches)
		require.NoError(t, tb.free(q64, 64<<20, 0))
		require.NoError(t, tb.free(q100, 100<<20, 0))
		require.NoError(t, a.Validate())
	}
}
