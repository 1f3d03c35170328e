package alloc_test

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/internal/faultbe"
	"github.com/stretchr/testify/require"
)

// tag registers a tag unique to the test (tags live for the process),
// with pinned backup or none (kindTag for the other kinds).
func tag(t *testing.T, base string, backup bool) (string, alloc.TagID) {
	t.Helper()
	if backup {
		return kindTag(t, base, alloc.BackupPinned)
	}
	return kindTag(t, base, alloc.BackupNone)
}

func TestTagsTakeTheirOwnSegments(t *testing.T) {
	a := newAllocator(t, nil)
	_, w := tag(t, "weights", false)
	_, kv := tag(t, "kv", false)
	p0, err := a.Alloc(1000, 0)
	require.NoError(t, err)
	p1, err := a.AllocTagged(1000, 0, w)
	require.NoError(t, err)
	p2, err := a.AllocTagged(1000, 0, kv)
	require.NoError(t, err)
	p3, err := a.AllocTagged(1000, 0, w)
	require.NoError(t, err)
	seg := func(p uintptr) alloc.SegmentInfo {
		info, err := a.Lookup(p)
		require.NoError(t, err)
		return info.Segment
	}
	require.NotEqual(t, seg(p0).HeapOff, seg(p1).HeapOff)
	require.NotEqual(t, seg(p1).HeapOff, seg(p2).HeapOff)
	require.Equal(t, seg(p1).HeapOff, seg(p3).HeapOff, "blocks of one tag share its segments")
	require.Equal(t, "", seg(p0).Tag)
	require.Equal(t, seg(p1).Tag, seg(p3).Tag)
	require.EqualValues(t, 3, stat(t, a, "segment.all.current"))
	require.NoError(t, a.Validate())
}

func TestTagNamesAreValidated(t *testing.T) {
	for _, bad := range []string{"", "..", "a b", "x/y", strings.Repeat("t", alloc.MaxTagLen+1)} {
		_, err := alloc.RegisterTag(bad, alloc.BackupNone)
		require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%q", bad)
	}
	name, _ := tag(t, "flags", true)
	_, err := alloc.RegisterTag(name, alloc.BackupNone)
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "a tag's backup flag is fixed")
	require.Contains(t, err.Error(), name)
}

// The placement of tagged blocks follows the call sequence: two allocators
// given the same calls hold every block at the same heap offsets, with a
// pause and resume in between.
func TestTaggedPlacementIsAFunctionOfTheCalls(t *testing.T) {
	_, w := tag(t, "w", true)
	name, kv := tag(t, "kv", false)
	run := func() []uint64 {
		a := newAllocator(t, nil)
		var offs []uint64
		for i, size := range []uintptr{3 << 20, 1000, 5000, 12 << 20, 700} {
			for _, id := range []alloc.TagID{0, w, kv} {
				p, err := a.AllocTagged(size+uintptr(i), 0, id)
				require.NoError(t, err)
				info, err := a.Lookup(p)
				require.NoError(t, err)
				offs = append(offs, info.HeapOff)
			}
			if i == 2 {
				_, err := a.Pause(name, alloc.PauseOptions{})
				require.NoError(t, err)
				_, err = a.Resume(name)
				require.NoError(t, err)
			}
		}
		return offs
	}
	require.Equal(t, run(), run())
}

func TestPauseResumeKeepsBackupOver100Cycles(t *testing.T) {
	a := newAllocator(t, nil)
	name, id := tag(t, "weights", true)
	sizes := []uintptr{1000, 300 << 10, 11 << 20}
	ptrs := make([]uintptr, len(sizes))
	for i, n := range sizes {
		p, err := a.AllocTagged(n, 0, id)
		require.NoError(t, err)
		poke(t, a, p, byte(0x10+i), n)
		ptrs[i] = p
	}
	reserved := stat(t, a, "reserved_bytes.all.current")
	for cycle := 0; cycle < 100; cycle++ {
		released, err := a.Pause(name, alloc.PauseOptions{})
		require.NoError(t, err)
		require.EqualValues(t, reserved, released)
		require.EqualValues(t, 0, stat(t, a, "reserved_bytes.all.current"))
		require.EqualValues(t, reserved, stat(t, a, "paused_bytes.all.current"))
		require.NoError(t, a.Validate())
		mapped, err := a.Resume(name)
		require.NoError(t, err)
		require.EqualValues(t, reserved, mapped)
		require.EqualValues(t, 0, stat(t, a, "paused_bytes.all.current"))
		for i, n := range sizes {
			info, err := a.Lookup(ptrs[i])
			require.NoError(t, err, "cycle %d: the block is where it was", cycle)
			require.Equal(t, ptrs[i], info.Addr)
			require.Equal(t, byte(0x10+i), peek(t, a, ptrs[i], 1)[0], "cycle %d block %d", cycle, i)
			require.Equal(t, byte(0x10+i), peek(t, a, ptrs[i]+n-1, 1)[0], "cycle %d block %d", cycle, i)
		}
		// Change the contents, so that each cycle restores its own copy.
		poke(t, a, ptrs[0], byte(0x10), 1)
	}
	require.NoError(t, a.Validate())
}

func TestResumeWithoutBackupIsZero(t *testing.T) {
	a := newAllocator(t, nil)
	name, id := tag(t, "kv", false)
	p, err := a.AllocTagged(5<<20, 0, id)
	require.NoError(t, err)
	poke(t, a, p, 0xee, 5<<20)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 5<<20), peek(t, a, p, 5<<20))
}

// rssShmem is the process's shared-memory footprint as the kernel counts it.
func rssShmem(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "RssShmem:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no RssShmem in /proc/self/status")
	return 0
}

func TestPauseGivesTheMemoryBack(t *testing.T) {
	a := newAllocator(t, nil)
	if a.Backend().Name() != "host" {
		t.Skip("the process footprint is the host backend's measure; the GPU test checks cuMemGetInfo")
	}
	name, id := tag(t, "big", true)
	const n = 64 << 20
	p, err := a.AllocTagged(n, 0, id)
	require.NoError(t, err)
	poke(t, a, p, 1, n)
	before := rssShmem(t)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	paused := rssShmem(t)
	require.GreaterOrEqual(t, before-paused, int64(n*9/10), "RssShmem %d -> %d while paused", before, paused)
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.GreaterOrEqual(t, rssShmem(t)-paused, int64(n*9/10), "the restored backup is resident again")
}

func TestPauseStateErrors(t *testing.T) {
	a := newAllocator(t, nil)
	name, id := tag(t, "t", false)
	_, err := a.Pause("never-opened-tag", alloc.PauseOptions{})
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
	require.Contains(t, err.Error(), "never-opened-tag")
	_, err = a.Pause("bad name", alloc.PauseOptions{})
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))

	p, err := a.AllocTagged(4096, 0, id)
	require.NoError(t, err)
	q, err := a.AllocTagged(8192, 0, id)
	require.NoError(t, err)
	_, err = a.Resume(name)
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err), "resuming a live tag")
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err), "pausing a paused tag")
	_, err = a.AllocTagged(100, 0, id)
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err), "allocating in a paused tag")
	require.Contains(t, err.Error(), name)
	untagged, err := a.Alloc(100, 0)
	require.NoError(t, err, "other tags are not affected")

	// Freeing a paused block is bookkeeping only; empty_cache leaves paused
	// segments alone (they hold no memory) and releases nothing twice.
	require.NoError(t, a.Free(p, 4096, 0))
	require.NoError(t, a.Validate())
	paused := stat(t, a, "paused_bytes.all.current")
	require.NoError(t, a.EmptyCache())
	require.Equal(t, paused, stat(t, a, "paused_bytes.all.current"))
	require.NoError(t, a.Validate())
	require.NoError(t, a.Free(q, 8192, 0))
	require.NoError(t, a.EmptyCache())
	require.Equal(t, paused, stat(t, a, "paused_bytes.all.current"))

	// Resume takes back the segment, now idle; empty_cache then releases it.
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.NoError(t, a.EmptyCache())
	require.EqualValues(t, 0, stat(t, a, "paused_bytes.all.current"))
	require.EqualValues(t, 1, stat(t, a, "segment.all.current"), "only the untagged segment is left")
	require.NoError(t, a.Free(untagged, 100, 0))
	require.NoError(t, a.Validate())

	// Every tag at once: "" pauses the live ones and resumes the paused ones.
	_, err = a.AllocTagged(100, 0, id)
	require.NoError(t, err)
	_, err = a.Pause("", alloc.PauseOptions{})
	require.NoError(t, err)
	_, paused2 := a.TagNames()
	require.Contains(t, paused2, name)
	_, err = a.Resume("")
	require.NoError(t, err)
	require.NoError(t, a.Validate())
}

func TestResumeOverTheLimitRollsBackAndRetries(t *testing.T) {
	a := newAllocator(t, nil)
	name, id := tag(t, "w", true)
	p, err := a.AllocTagged(30<<20, 0, id)
	require.NoError(t, err)
	poke(t, a, p, 0x42, 30<<20)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	other, err := a.Alloc(1<<20, 0) // 2 MiB reserved by someone else
	require.NoError(t, err)
	a.SetLimit(16 << 20)
	_, err = a.Resume(name)
	require.Equal(t, core.ErrOutOfMemory, core.CodeOf(err))
	require.Contains(t, err.Error(), name)
	require.Contains(t, err.Error(), fmt.Sprint(30<<20))
	require.EqualValues(t, 30<<20, stat(t, a, "paused_bytes.all.current"), "still paused")
	require.NoError(t, a.Validate())
	a.SetLimit(0)
	_, err = a.Resume(name)
	require.NoError(t, err, "a retry succeeds")
	require.Equal(t, byte(0x42), peek(t, a, p, 30<<20)[30<<20-1])
	require.NoError(t, a.Free(other, 0, 0))
}

func TestResumeThatRunsOutHalfwayUnmapsWhatItMapped(t *testing.T) {
	fb := faultbe.New(testBackend(t))
	a := newAllocator(t, fb)
	name, id := tag(t, "w", true)
	var ptrs []uintptr
	for i := 0; i < 3; i++ { // three 22 MiB blocks: three segments of their own
		p, err := a.AllocTagged(22<<20, 0, id)
		require.NoError(t, err)
		poke(t, a, p, byte(i+1), 22<<20)
		ptrs = append(ptrs, p)
	}
	_, err := a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	// The third segment fails, and so does the retry after releasing idle
	// segments.
	fb.Add(faultbe.Rule{Method: "Create", Nth: 3, Code: core.ErrOutOfMemory})
	fb.Add(faultbe.Rule{Method: "Create", Nth: 4, Code: core.ErrOutOfMemory})
	c0, r0, m0, u0 := fb.Count("Create"), fb.Count("Release"), fb.Count("Map"), fb.Count("Unmap")
	_, err = a.Resume(name)
	require.Equal(t, core.ErrOutOfMemory, core.CodeOf(err))
	require.Contains(t, err.Error(), name)
	require.Contains(t, err.Error(), fmt.Sprint(3*(22<<20)))
	created := fb.Count("Create") - c0 - len(fb.Injected())
	require.Equal(t, created, fb.Count("Release")-r0, "every segment created by the failed resume was released")
	require.Equal(t, fb.Count("Map")-m0, fb.Count("Unmap")-u0, "and unmapped")
	require.EqualValues(t, 3*(22<<20), stat(t, a, "paused_bytes.all.current"))
	require.NoError(t, a.Validate())
	fb.Clear()
	_, err = a.Resume(name)
	require.NoError(t, err)
	for i, p := range ptrs {
		require.Equal(t, byte(i+1), peek(t, a, p, 1)[0])
	}
}

// TestPauseUnderInjectedFaults fails, in turn, each of the first calls of
// every backend method that a pause and a resume make, and checks what they
// promise: an error with the injected fault's message, a clean validator,
// and, once the fault is gone, a resume (or a pause and a resume) that brings
// the contents back at the same addresses.
func TestPauseUnderInjectedFaults(t *testing.T) {
	workload := func(t *testing.T, a *alloc.Allocator, name string) {
		_, err := a.Pause(name, alloc.PauseOptions{})
		if err != nil {
			require.True(t, faultbe.IsInjected(err), "an error that is not the injected fault: %v", err)
		}
		require.NoError(t, a.Validate())
		if _, paused := a.TagNames(); len(paused) == 0 {
			return // the pause failed before releasing anything
		}
		if _, err := a.Resume(name); err != nil {
			require.True(t, faultbe.IsInjected(err), "an error that is not the injected fault: %v", err)
		}
		require.NoError(t, a.Validate())
	}
	// Two tags: one with backup (its blocks must come back), one without
	// (zeroed on resume: the Memset path); the workload acts on both ("").
	setup := func(t *testing.T, fb *faultbe.Backend) (*alloc.Allocator, string, []uintptr) {
		a := newAllocator(t, fb)
		_, id := tag(t, "f", true)
		_, kv := tag(t, "kv", false)
		var ptrs []uintptr
		for i, n := range []uintptr{4096, 22 << 20} {
			p, err := a.AllocTagged(n, 0, id)
			require.NoError(t, err)
			poke(t, a, p, byte(0x30+i), n)
			ptrs = append(ptrs, p)
		}
		_, err := a.AllocTagged(8192, 0, kv)
		require.NoError(t, err)
		return a, "", ptrs
	}
	dry := faultbe.New(testBackend(t))
	a, name, _ := setup(t, dry)
	before := map[string]int{}
	for _, m := range faultbe.Methods {
		before[m] = dry.Count(m)
	}
	workload(t, a, name)
	for _, method := range faultbe.Methods {
		for n := 1; n <= min(2, dry.Count(method)-before[method]); n++ {
			t.Run(fmt.Sprintf("%s#%d", method, n), func(t *testing.T) {
				fb := faultbe.New(testBackend(t))
				a, name, ptrs := setup(t, fb)
				fb.FailNth(method, n)
				workload(t, a, name)
				require.NotEmpty(t, fb.Injected(), "the fault was never reached")
				fb.Clear()
				_, err := a.Resume(name) // every paused tag, if any
				require.NoError(t, err)
				for i, p := range ptrs {
					info, err := a.Lookup(p)
					require.NoError(t, err)
					require.Equal(t, p, info.Addr)
					require.Equal(t, byte(0x30+i), peek(t, a, p, 1)[0], "block %d after a fault in %s#%d", i, method, n)
				}
				_, err = a.Pause(name, alloc.PauseOptions{})
				require.NoError(t, err)
				_, err = a.Resume(name)
				require.NoError(t, err)
				require.NoError(t, a.Validate())
			})
		}
	}
}

func TestLocalPauseRefusesExportedSegments(t *testing.T) {
	a := newAllocator(t, nil)
	name, id := tag(t, "sym", false)
	p, err := a.AllocTagged(4096, 0, id)
	require.NoError(t, err)
	info, err := a.Lookup(p)
	require.NoError(t, err)
	fd, err := a.ExportSegment(info.Segment.Addr)
	require.NoError(t, err)
	closeFD(fd)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err))
	require.Contains(t, err.Error(), "symmem_pause_group")
	require.EqualValues(t, 0, stat(t, a, "paused_bytes.all.current"), "nothing was released")
	_, err = a.Pause(name, alloc.PauseOptions{Collective: true})
	require.NoError(t, err)
	_, err = a.ExportSegment(info.Segment.Addr)
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err), "a paused segment cannot be exported")
	_, err = a.Resume(name)
	require.NoError(t, err)
}

func closeFD(fd int) { _ = syscall.Close(fd) }
