package alloc_test

import (
	"math/rand"
	"os"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/host"
	_ "github.com/libsymmem/libsymmem/cuda" // so that auto selection can pick it on a GPU machine
	"github.com/stretchr/testify/require"
)

// testBackend is the backend the tests run on: the one SYMMEM_BACKEND
// selects (auto: cuda where a GPU is, host otherwise). With
// SYMMEM_REQUIRE_GPU=1 anything but cuda fails the test.
func testBackend(t testing.TB) core.Backend {
	t.Helper()
	be, notes, err := core.BackendFromEnv()
	require.NoError(t, err)
	if os.Getenv("SYMMEM_REQUIRE_GPU") == "1" && be.Name() != "cuda" {
		t.Fatalf("SYMMEM_REQUIRE_GPU=1 but the %s backend was chosen: %v", be.Name(), notes)
	}
	return be
}

func newAllocator(t testing.TB, be core.Backend) *alloc.Allocator {
	t.Helper()
	if be == nil {
		be = testBackend(t)
	}
	a, err := alloc.NewAllocator(be, 0)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

func stat(t testing.TB, a *alloc.Allocator, key string) int64 {
	t.Helper()
	for _, s := range a.Stats() {
		if s.Key == key {
			return s.Value
		}
	}
	t.Fatalf("no statistic %q", key)
	return 0
}

// poke and peek write and read n bytes of a block through the backend, so
// that the same checks run on device memory.
func poke(t testing.TB, a *alloc.Allocator, p uintptr, v byte, n uintptr) {
	t.Helper()
	require.NoError(t, a.Backend().Memset(a.Device(), 0, p, v, n))
}

func peek(t testing.TB, a *alloc.Allocator, p uintptr, n uintptr) []byte {
	t.Helper()
	buf := make([]byte, n)
	require.NoError(t, a.Backend().Copy(a.Device(), 0, uintptr(unsafe.Pointer(&buf[0])), p, n))
	runtime.KeepAlive(buf)
	return buf
}

func TestAllocFreeRoundTrip(t *testing.T) {
	a := newAllocator(t, nil)
	p, err := a.Alloc(1000, 0)
	require.NoError(t, err)
	require.Zero(t, p%512, "blocks are 512-byte aligned")
	poke(t, a, p, 0x5a, 1000)
	require.Equal(t, byte(0x5a), peek(t, a, p, 1000)[999])
	require.EqualValues(t, 1024, stat(t, a, "allocated_bytes.all.current"))
	require.EqualValues(t, 1000, stat(t, a, "requested_bytes.all.current"))
	require.EqualValues(t, 2<<20, stat(t, a, "reserved_bytes.small_pool.current"))
	require.EqualValues(t, 1, stat(t, a, "allocation.all.current"))
	require.NoError(t, a.Validate())
	require.NoError(t, a.Free(p, 1000, 0))
	require.EqualValues(t, 0, stat(t, a, "allocated_bytes.all.current"))
	require.EqualValues(t, 1024, stat(t, a, "allocated_bytes.all.peak"))
	require.NoError(t, a.Validate())

	// The cached block comes back for the same request on the same stream.
	q, err := a.Alloc(1000, 0)
	require.NoError(t, err)
	require.Equal(t, p, q)
	require.EqualValues(t, 1, stat(t, a, "num_device_alloc"))
	require.NoError(t, a.Free(q, 0, 0))
}

func TestSegmentSizesFollowPools(t *testing.T) {
	a := newAllocator(t, nil)
	cases := []struct {
		size    uintptr
		segment int64
		pool    string
	}{
		{512, 2 << 20, "small_pool"},
		{1 << 20, 2 << 20, "small_pool"},
		{(1 << 20) + 1, 20 << 20, "large_pool"},
		{9 << 20, 20 << 20, "large_pool"},
		{(10 << 20) + 1, 12 << 20, "large_pool"},
	}
	for _, c := range cases {
		before := stat(t, a, "reserved_bytes."+c.pool+".current")
		p, err := a.Alloc(c.size, core.Stream(0x1000+c.size)) // a fresh stream: a fresh segment
		require.NoError(t, err)
		require.Equal(t, c.segment, stat(t, a, "reserved_bytes."+c.pool+".current")-before, "size %d", c.size)
		info, err := a.Lookup(p)
		require.NoError(t, err)
		require.EqualValues(t, c.segment, info.Segment.Size)
		require.NoError(t, a.Free(p, c.size, 0))
	}
	require.NoError(t, a.Validate())
}

func TestSplitAndMerge(t *testing.T) {
	a := newAllocator(t, nil)
	var ps []uintptr
	for i := 0; i < 8; i++ {
		p, err := a.Alloc(4096, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i := 1; i < len(ps); i++ {
		require.Equal(t, ps[i-1]+4096, ps[i], "blocks are carved in order from one segment")
	}
	// Free every other block, then the rest: the segment must merge back to
	// one free block, which a 2 MiB-sized small request can use whole.
	for i := 0; i < len(ps); i += 2 {
		require.NoError(t, a.Free(ps[i], 4096, 0))
		require.NoError(t, a.Validate())
	}
	for i := 1; i < len(ps); i += 2 {
		require.NoError(t, a.Free(ps[i], 4096, 0))
		require.NoError(t, a.Validate())
	}
	p, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.Equal(t, ps[0], p)
	require.EqualValues(t, 1, stat(t, a, "segment.all.current"))
	require.NoError(t, a.Free(p, 0, 0))
}

func TestBestFitBySizeThenOffset(t *testing.T) {
	a := newAllocator(t, nil)
	// Make holes of 8 KiB at a low offset and 4 KiB at a higher one.
	var ps []uintptr
	for _, n := range []uintptr{8192, 512, 4096, 512} {
		p, err := a.Alloc(n, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	require.NoError(t, a.Free(ps[0], 0, 0))
	require.NoError(t, a.Free(ps[2], 0, 0))
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	require.Equal(t, ps[2], p, "the exact-size hole wins over the lower, larger one")
	q, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	require.Equal(t, ps[0], q, "then the 8 KiB hole is split")
	require.NoError(t, a.Validate())
}

func TestStreamsKeepTheirBlocks(t *testing.T) {
	a := newAllocator(t, nil)
	p, err := a.Alloc(4096, 1)
	require.NoError(t, err)
	require.NoError(t, a.Free(p, 4096, 1))
	q, err := a.Alloc(4096, 2)
	require.NoError(t, err)
	require.NotEqual(t, p, q, "a block freed on stream 1 is not handed to stream 2")
	r, err := a.Alloc(4096, 1)
	require.NoError(t, err)
	require.Equal(t, p, r)
	// Freeing with the wrong stream argument still returns the block to the
	// stream it was allocated on.
	require.NoError(t, a.Free(q, 4096, 1))
	s, err := a.Alloc(4096, 2)
	require.NoError(t, err)
	require.Equal(t, q, s)
	require.NoError(t, a.Validate())
}

func TestBadPointers(t *testing.T) {
	a := newAllocator(t, nil)
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	before := a.Stats()

	var x int
	err = a.Free(uintptr(unsafe.Pointer(&x)), 8, 0)
	require.Equal(t, core.ErrInvalidPointer, core.CodeOf(err))
	require.Contains(t, err.Error(), "not allocated by libsymmem")

	err = a.Free(p+512, 0, 0)
	require.Equal(t, core.ErrInvalidPointer, core.CodeOf(err))
	require.Contains(t, err.Error(), "inside the block")
	require.Equal(t, before, a.Stats(), "a bad free changes nothing")

	require.NoError(t, a.Free(p, 4096, 0))
	err = a.Free(p, 4096, 0)
	require.Equal(t, core.ErrInvalidPointer, core.CodeOf(err))
	require.Contains(t, err.Error(), "double free")

	q, err := a.Alloc(100, 0)
	require.NoError(t, err)
	err = a.Free(q, 200, 0)
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "size mismatch is reported")
	require.EqualValues(t, 0, stat(t, a, "allocation.all.current"), "but the block is freed")
	require.NoError(t, a.Validate())
}

func TestZeroSizeGivesDistinctBlocks(t *testing.T) {
	a := newAllocator(t, nil)
	seen := map[uintptr]bool{}
	var ps []uintptr
	for i := 0; i < 1000; i++ {
		p, err := a.Alloc(0, 0)
		require.NoError(t, err)
		require.NotZero(t, p)
		require.False(t, seen[p])
		seen[p] = true
		ps = append(ps, p)
	}
	rand.New(rand.NewSource(1)).Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
	for _, p := range ps {
		require.NoError(t, a.Free(p, 0, 0))
	}
	require.EqualValues(t, 0, stat(t, a, "allocated_bytes.all.current"))
	require.NoError(t, a.Validate())
}

func TestHugeRequestsFailCleanly(t *testing.T) {
	a := newAllocator(t, nil)
	for _, n := range []uintptr{^uintptr(0), ^uintptr(0) / 2, uintptr(a.TotalMemory()) + 1} {
		_, err := a.Alloc(n, 0)
		require.Equal(t, core.ErrOutOfMemory, core.CodeOf(err), "size %d", n)
	}
	require.EqualValues(t, 3, stat(t, a, "num_ooms"))
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p, 0, 0))
}

func TestMemoryLimitReleasesCacheThenFails(t *testing.T) {
	a := newAllocator(t, nil)
	a.SetLimit(24 << 20)
	p, err := a.Alloc(12<<20, 0) // own 12 MiB segment
	require.NoError(t, err)
	require.NoError(t, a.Free(p, 0, 0))
	// 12 MiB cached + 14 MiB new > 24 MiB: the cache is released, then it fits.
	q, err := a.Alloc(14<<20, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, stat(t, a, "num_alloc_retries"))
	require.EqualValues(t, 14<<20, stat(t, a, "reserved_bytes.all.current"))
	_, err = a.Alloc(12<<20, 0)
	require.Equal(t, core.ErrOutOfMemory, core.CodeOf(err))
	require.Contains(t, err.Error(), "memory limit")
	require.EqualValues(t, 1, stat(t, a, "num_ooms"))
	require.NoError(t, a.Free(q, 0, 0))
	r, err := a.Alloc(12<<20, 0)
	require.NoError(t, err, "the allocator keeps working after an OOM")
	require.NoError(t, a.Free(r, 0, 0))
	require.NoError(t, a.Validate())
}

func TestEmptyCacheReleasesIdleSegments(t *testing.T) {
	a := newAllocator(t, nil)
	keep, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	p, err := a.Alloc(12<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p, 0, 0))
	require.EqualValues(t, 14<<20, stat(t, a, "reserved_bytes.all.current"))
	require.NoError(t, a.EmptyCache())
	require.EqualValues(t, 2<<20, stat(t, a, "reserved_bytes.all.current"))
	require.EqualValues(t, 1, stat(t, a, "num_device_free"))
	poke(t, a, keep, 7, 4096) // still mapped
	require.Equal(t, byte(7), peek(t, a, keep, 4096)[4095])
	require.NoError(t, a.Free(keep, 0, 0))
	require.NoError(t, a.EmptyCache())
	require.EqualValues(t, 0, stat(t, a, "reserved_bytes.all.current"))
	require.NoError(t, a.Validate())
}

func TestLookupInteriorPointer(t *testing.T) {
	a := newAllocator(t, nil)
	_, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	p, err := a.Alloc(3000, 0)
	require.NoError(t, err)
	info, err := a.Lookup(p + 100)
	require.NoError(t, err)
	require.Equal(t, p, info.Addr)
	require.EqualValues(t, 3072, info.Size)
	require.EqualValues(t, 3000, info.Requested)
	require.EqualValues(t, 4096, info.HeapOff)
	require.EqualValues(t, 2, info.Allocs)
	_, err = a.Lookup(p + 4000)
	require.Equal(t, core.ErrInvalidPointer, core.CodeOf(err))
}

// op is one step of a random call sequence.
type op struct {
	alloc  bool
	size   uintptr
	stream int // stream number; each allocator maps numbers to its own pointers
	victim int // index into live allocations, for frees
}

func randomOps(seed int64, n int) []op {
	r := rand.New(rand.NewSource(seed))
	sizes := []uintptr{0, 1, 511, 512, 4000, 65536, 1 << 20, (1 << 20) + 1, 3 << 20, 11 << 20, 33 << 20}
	ops := make([]op, n)
	for i := range ops {
		ops[i] = op{alloc: r.Intn(5) < 3, size: sizes[r.Intn(len(sizes))] + uintptr(r.Intn(3000)),
			stream: r.Intn(3), victim: r.Int()}
	}
	return ops
}

// run plays ops on a and returns the heap offset of every allocation made.
func run(t testing.TB, a *alloc.Allocator, ops []op, streamBase core.Stream) []uint64 {
	var live []uintptr
	var offs []uint64
	for _, o := range ops {
		if o.alloc || len(live) == 0 {
			p, err := a.Alloc(o.size, streamBase+core.Stream(o.stream)*0x40)
			require.NoError(t, err)
			info, err := a.Lookup(p)
			require.NoError(t, err)
			offs = append(offs, info.HeapOff)
			live = append(live, p)
		} else {
			i := o.victim % len(live)
			require.NoError(t, a.Free(live[i], 0, 0))
			live = append(live[:i], live[i+1:]...)
		}
	}
	for _, p := range live {
		require.NoError(t, a.Free(p, 0, 0))
	}
	return offs
}

// TestPlacementIsAPureFunctionOfTheCallSequence is DESIGN invariant 2: two
// allocators (as in two ranks) fed the same calls, with different stream
// pointers numbered the same by first use, hand out the same heap offsets.
func TestPlacementIsAPureFunctionOfTheCallSequence(t *testing.T) {
	for seed := int64(1); seed <= 5; seed++ {
		ops := randomOps(seed, 600)
		a, b := newAllocator(t, nil), newAllocator(t, nil)
		// Make b's addresses differ from a's: a's heap is already reserved.
		offA := run(t, a, ops, 0x7000)
		offB := run(t, b, ops, 0x9100)
		require.Equal(t, offA, offB, "seed %d", seed)
		require.NoError(t, a.Validate())
		require.NoError(t, b.Validate())
	}
}

func TestConcurrentAllocFree(t *testing.T) {
	a := newAllocator(t, nil)
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(g)))
			var live []uintptr
			for i := 0; i < 2000; i++ {
				if r.Intn(2) == 0 || len(live) == 0 {
					n := uintptr(r.Intn(200000))
					p, err := a.Alloc(n, core.Stream(g%4))
					if err != nil {
						t.Error(err)
						return
					}
					if err := a.Backend().Memset(a.Device(), 0, p, byte(g), 1); err != nil {
						t.Error(err)
						return
					}
					live = append(live, p)
				} else {
					k := r.Intn(len(live))
					// The backend writes through got's address as a uintptr: a
					// buffer that did not escape would live on this goroutine's
					// stack, which may move during the call (the write then
					// lands in the old stack and got reads 0). Pinning puts it
					// on the heap and keeps it there.
					got := make([]byte, 1)
					var pin runtime.Pinner
					pin.Pin(&got[0])
					err := a.Backend().Copy(a.Device(), 0, uintptr(unsafe.Pointer(&got[0])), live[k], 1)
					pin.Unpin()
					if err != nil || got[0] != byte(g) {
						t.Errorf("goroutine %d: block %#x was overwritten (%d, %v)", g, live[k], got[0], err)
					}
					if err := a.Free(live[k], 0, 0); err != nil {
						t.Error(err)
						return
					}
					live = append(live[:k], live[k+1:]...)
				}
				if i%500 == 0 {
					if err := a.Validate(); err != nil {
						t.Error(err)
					}
				}
			}
			for _, p := range live {
				if err := a.Free(p, 0, 0); err != nil {
					t.Error(err)
				}
			}
		}(g)
	}
	wg.Wait()
	require.NoError(t, a.Validate())
	require.EqualValues(t, 0, stat(t, a, "allocation.all.current"))
}

// FuzzAllocFree plays a byte string as alloc/free calls and checks every
// invariant after each one.
func FuzzAllocFree(f *testing.F) {
	f.Add([]byte{0, 10, 1, 0, 0, 200, 2, 5, 1, 1})
	f.Add([]byte{3, 255, 3, 254, 1, 0, 1, 0, 0, 0})
	hb, err := host.New()
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := alloc.NewAllocator(hb, 0)
		require.NoError(t, err)
		defer func() { require.NoError(t, a.Close()) }()
		var live []uintptr
		for i := 0; i+1 < len(data) && i < 400; i += 2 {
			kind, arg := data[i]%4, uintptr(data[i+1])
			switch {
			case kind == 1 && len(live) > 0:
				k := int(arg) % len(live)
				require.NoError(t, a.Free(live[k], 0, 0))
				live = append(live[:k], live[k+1:]...)
			case kind == 2:
				require.NoError(t, a.EmptyCache())
			default:
				// sizes from 0 to ~40 MiB on a log-ish scale
				n := (arg & 0x3f) << (arg >> 6 * 6)
				p, err := a.Alloc(n, core.Stream(arg%3))
				require.NoError(t, err)
				live = append(live, p)
			}
			require.NoError(t, a.Validate())
		}
	})
}

func TestBlockTableAgainstMap(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	var tab alloc.BlockTableForTest
	ref := map[uintptr]int{}
	for i := 0; i < 200000; i++ {
		addr := uintptr(r.Intn(5000)+1) * 512
		switch r.Intn(3) {
		case 0, 1:
			tab.Put(addr, i)
			ref[addr] = i
		default:
			tab.Delete(addr)
			delete(ref, addr)
		}
		if i%1000 == 0 {
			require.Equal(t, len(ref), tab.Len())
			for a, v := range ref {
				got, ok := tab.Get(a)
				require.True(t, ok)
				require.Equal(t, v, got)
			}
		}
	}
}

// inactive_split counts the free blocks of split segments, as PyTorch's does.
func TestInactiveSplitStatistics(t *testing.T) {
	a := newAllocator(t, nil)
	p1, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), stat(t, a, "inactive_split.small_pool.current"), "the rest of the segment")
	require.Equal(t, int64(2<<20-4096), stat(t, a, "inactive_split_bytes.all.current"))
	p2, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	p3, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p2, 4096, 0))
	require.Equal(t, int64(2), stat(t, a, "inactive_split.all.current"), "the hole and the rest")
	require.Equal(t, int64(2<<20-2*4096), stat(t, a, "inactive_split_bytes.all.current"))
	require.NoError(t, a.Validate())
	require.NoError(t, a.Free(p1, 4096, 0))
	require.NoError(t, a.Free(p3, 4096, 0))
	// The whole segment is one free block again: not split, releasable.
	require.Equal(t, int64(0), stat(t, a, "inactive_split.all.current"))
	require.Equal(t, int64(0), stat(t, a, "inactive_split_bytes.all.current"))
	require.Equal(t, int64(2), stat(t, a, "inactive_split.all.peak"))
	require.Equal(t, int64(-1), stat(t, a, "max_split_size"))
	require.Equal(t, int64(0), stat(t, a, "oversize_allocations.current"))
	require.NoError(t, a.Validate())
}
