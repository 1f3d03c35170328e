package alloc_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/internal/faultbe"
	"github.com/stretchr/testify/require"
)

func countFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

// countMemfdMaps counts the mappings of memfds (host segments).
func countMemfdMaps() int {
	b, _ := os.ReadFile("/proc/self/maps")
	return strings.Count(string(b), "/memfd:")
}

// TestAllocatorUnderInjectedFaults runs a workload of every allocator
// operation (alloc from a new segment, small and large, free, empty_cache,
// reuse) with the Nth call of each backend method failing, and checks what
// the allocator promises: every failed operation returns an error with a
// message and a code, nothing panics, the validator is clean after every
// step, the allocator works again once the fault is gone, and nothing leaks
// (descriptors, mappings) but what an error said it deliberately leaked.
func TestAllocatorUnderInjectedFaults(t *testing.T) {
	// A dry run counts the calls of each method that the workload makes;
	// then each of the first three calls of each method fails in turn.
	dry := faultbe.New(testBackend(t))
	a, leaked := allocatorWorkload(t, dry)
	require.Zero(t, leaked, "the workload leaks without faults")
	calls := map[string]int{}
	for _, m := range faultbe.Methods {
		calls[m] = dry.Count(m)
	}
	require.NoError(t, a.Close())
	type faultCase struct {
		name string
		arm  func(fb *faultbe.Backend)
	}
	var cases []faultCase
	for _, method := range faultbe.Methods {
		for n := 1; n <= min(3, calls[method]); n++ {
			cases = append(cases, faultCase{fmt.Sprintf("%s#%d", method, n), func(fb *faultbe.Backend) { fb.FailNth(method, n) }})
		}
	}
	// Short results (a smaller device from MemoryInfo): every call short.
	for _, method := range faultbe.ShortMethods {
		if calls[method] > 0 {
			cases = append(cases, faultCase{"short " + method, func(fb *faultbe.Backend) { fb.Add(faultbe.Rule{Method: method, Short: true}) }})
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fds0, maps0 := countFDs(), countMemfdMaps()
			fb := faultbe.New(testBackend(t))
			c.arm(fb)
			a, leaked := allocatorWorkload(t, fb)
			require.NotEmpty(t, fb.Injected(), "the fault was never reached")
			// The fault is gone: the allocator works and gives everything back.
			fb.Clear()
			if a == nil { // creating it failed: it must work now
				var err error
				a, err = alloc.NewAllocator(fb, 0)
				require.NoError(t, err)
			}
			p, err := a.Alloc(8192, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(p, 8192, 0))
			require.NoError(t, a.EmptyCache())
			require.NoError(t, a.Validate())
			require.Zero(t, stat(t, a, "segment.all.current"))
			require.NoError(t, a.Close())
			if fb.Name() == "host" {
				// A Release that failed leaves its memfd open (leaked, as
				// the error said); nothing else stays.
				require.Equal(t, fds0+leaked, countFDs(), "descriptors (%d deliberately leaked)", leaked)
				require.Equal(t, maps0, countMemfdMaps(), "memfd mappings")
			}
		})
	}
}

// allocatorWorkload creates an allocator on fb and runs every allocator
// operation once or twice, checking each failure and the validator after
// each step. It returns the allocator (nil if creating it failed) and the
// number of errors that said memory was deliberately leaked.
func allocatorWorkload(t *testing.T, fb *faultbe.Backend) (*alloc.Allocator, int) {
	leaked := 0
	checkErr := func(what string, err error) {
		if err == nil {
			return
		}
		require.NotEqual(t, core.Success, core.CodeOf(err), what)
		require.NotEmpty(t, err.Error(), what)
		require.True(t, faultbe.IsInjected(err), "%s: an error that is not the injected fault: %v", what, err)
		if strings.Contains(err.Error(), "leaked") {
			leaked++
		}
	}
	a, err := alloc.NewAllocator(fb, 0)
	checkErr("NewAllocator", err)
	if err != nil {
		return nil, 0
	}
	var small, large uintptr
	steps := []struct {
		what string
		run  func() error
	}{
		{"alloc small", func() (err error) { small, err = a.Alloc(4096, 0); return }},
		{"alloc large", func() (err error) { large, err = a.Alloc(30<<20, 0); return }},
		{"free small", func() error { return freeIf(a, &small, 4096) }},
		{"empty_cache with a live block", a.EmptyCache},
		{"free large", func() error { return freeIf(a, &large, 30<<20) }},
		{"empty_cache", a.EmptyCache},
		{"alloc small again", func() (err error) { small, err = a.Alloc(4096, 0); return }},
		{"free small again", func() error { return freeIf(a, &small, 4096) }},
		{"empty_cache again", a.EmptyCache},
	}
	for _, s := range steps {
		err := s.run()
		checkErr(s.what, err)
		require.NoError(t, a.Validate(), "after %s (err %v)", s.what, err)
	}
	return a, leaked
}

func freeIf(a *alloc.Allocator, p *uintptr, size uintptr) error {
	if *p == 0 {
		return nil
	}
	err := a.Free(*p, size, 0)
	*p = 0
	return err
}

// TestUnmappedSegmentLeavesThePool: when Unmap succeeds and Release fails,
// the segment must leave the cache (its addresses hold no memory any more):
// the next allocation gets a new, usable segment, and the error says the
// physical memory was leaked.
func TestUnmappedSegmentLeavesThePool(t *testing.T) {
	fb := faultbe.New(testBackend(t))
	a, err := alloc.NewAllocator(fb, 0)
	require.NoError(t, err)
	defer a.Close()
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p, 4096, 0))
	fb.FailNth("Release", 1)
	err = a.EmptyCache()
	require.Error(t, err)
	require.Contains(t, err.Error(), "leaked")
	require.Equal(t, 1, fb.Count("Unmap"))
	require.NoError(t, a.Validate())
	require.Zero(t, stat(t, a, "segment.all.current"), "the unmapped segment is not cached")
	q, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	poke(t, a, q, 0x5a, 4096) // faults if q were in the unmapped segment
	require.Equal(t, byte(0x5a), peek(t, a, q, 4096)[4095])
	require.NoError(t, a.Free(q, 4096, 0))
}

// TestValidatorCatchesUnmappedSegment: an unmapped segment still cached is
// reported by the validator.
func TestValidatorCatchesUnmappedSegment(t *testing.T) {
	a := newAllocator(t, nil)
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p, 4096, 0))
	a.MarkFirstSegmentUnmappedForTest()
	err = a.Validate()
	require.Equal(t, core.ErrInternal, core.CodeOf(err))
	require.Contains(t, err.Error(), "unmapped but still in the heap")
	// Close must still work on it (t.Cleanup).
}

// TestFailedSyncKeepsSegmentsMapped: a device synchronisation that fails
// before empty_cache releases memory leaves every segment mapped and cached.
func TestFailedSyncKeepsSegmentsMapped(t *testing.T) {
	fb := faultbe.New(testBackend(t))
	a, err := alloc.NewAllocator(fb, 0)
	require.NoError(t, err)
	defer a.Close()
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p, 4096, 0))
	fb.FailNth("SynchronizeDevice", 1)
	require.Error(t, a.EmptyCache())
	require.Zero(t, fb.Count("Unmap"), "nothing may be unmapped after a failed synchronisation")
	require.Equal(t, int64(1), stat(t, a, "segment.all.current"))
	require.NoError(t, a.Validate())
}
