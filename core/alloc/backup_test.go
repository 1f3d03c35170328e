package alloc_test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// kindTag registers a tag of backup kind unique to the test.
func kindTag(t *testing.T, base string, kind alloc.BackupKind) (string, alloc.TagID) {
	t.Helper()
	name := fmt.Sprintf("%s-%s", base, strings.NewReplacer("/", ".", "#", "_").Replace(t.Name()))
	id, err := alloc.RegisterTag(name, kind)
	require.NoError(t, err)
	return name, id
}

// pinningBackend gives a backend host memory that is "pinned" slowly: each
// AllocHost takes delay, and the calls are counted, so a test sees when the
// pinning happens.
type pinningBackend struct {
	core.Backend
	delay  time.Duration
	allocs atomic.Int64
	frees  atomic.Int64
	mu     sync.Mutex
	live   map[uintptr]uintptr
}

func newPinningBackend(t *testing.T, delay time.Duration) *pinningBackend {
	return &pinningBackend{Backend: testBackend(t), delay: delay, live: map[uintptr]uintptr{}}
}

func (b *pinningBackend) AllocHost(dev int, size uintptr) (uintptr, error) {
	time.Sleep(b.delay)
	p, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return 0, err
	}
	b.allocs.Add(1)
	b.mu.Lock()
	b.live[uintptr(p)] = size
	b.mu.Unlock()
	return uintptr(p), nil
}

func (b *pinningBackend) FreeHost(dev int, addr, size uintptr) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.live[addr] != size {
		return fmt.Errorf("FreeHost(%#x, %d) of memory AllocHost did not return", addr, size)
	}
	delete(b.live, addr)
	b.frees.Add(1)
	return unix.MunmapPtr(unmanaged.Pointer(addr), size)
}

// isPinned says whether addr is in memory AllocHost returned.
func (b *pinningBackend) isPinned(addr uintptr) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for p, n := range b.live {
		if addr >= p && addr < p+n {
			return true
		}
	}
	return false
}

func (b *pinningBackend) liveCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.live)
}

// A tag with pinned backup pins its host copy when its segment is made, in
// the background: the first pause finds it (no AllocHost during the pause)
// and the contents survive.
func TestPinnedBackupIsPinnedAhead(t *testing.T) {
	be := newPinningBackend(t, 50*time.Millisecond)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPinned)
	p, err := a.AllocTagged(3<<20, 0, id)
	require.NoError(t, err)
	poke(t, a, p, 0x5c, 3<<20)
	require.Eventually(t, func() bool { return be.allocs.Load() == 1 }, 5*time.Second, time.Millisecond,
		"the host copy is pinned without a pause")
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 1, be.allocs.Load(), "the pause used the copy pinned ahead")
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.Equal(t, byte(0x5c), peek(t, a, p+(3<<20)-1, 1)[0])
	require.NoError(t, a.Free(p, 0, 0))
	require.NoError(t, a.EmptyCache())
	require.Eventually(t, func() bool { return be.liveCount() == 0 }, 5*time.Second, time.Millisecond,
		"the segment's release frees its host copy")
}

// A pause right after the allocation of a large segment does not wait for
// the pinning in flight: it copies to pageable memory, and the pinned copy
// takes over at the next pause.
func TestFirstPauseDoesNotWaitForPinning(t *testing.T) {
	be := newPinningBackend(t, 2*time.Second)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPinned)
	const n = 40 << 20 // past pinWaitMax: small segments wait for their pinning
	p, err := a.AllocTagged(n, 0, id)
	require.NoError(t, err)
	poke(t, a, p, 0x17, n)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	host, _, err := a.BackupOf(p, 1)
	require.NoError(t, err)
	require.False(t, be.isPinned(host), "the first pause copied to pageable memory")
	require.Equal(t, byte(0x17), hostByte(host))
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.Equal(t, byte(0x17), peek(t, a, p, 1)[0])
	require.Eventually(t, func() bool { return be.allocs.Load() == 1 }, 5*time.Second, time.Millisecond)
	poke(t, a, p, 0x18, 1)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	host, _, err = a.BackupOf(p, 1)
	require.NoError(t, err)
	require.True(t, be.isPinned(host), "the pinned copy took over")
	require.Equal(t, byte(0x18), hostByte(host))
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.Equal(t, byte(0x18), peek(t, a, p, 1)[0])
	require.Equal(t, byte(0x17), peek(t, a, p+1, 1)[0])
	require.EqualValues(t, 1, be.allocs.Load(), "one pinned copy")
	require.NoError(t, a.Validate())
}

// A segment released while its copy is still being pinned frees the copy
// when it arrives: nothing leaks.
func TestReleaseDuringPinningFreesTheCopyLater(t *testing.T) {
	be := newPinningBackend(t, 100*time.Millisecond)
	a := newAllocator(t, be)
	_, id := kindTag(t, "w", alloc.BackupPinned)
	p, err := a.AllocTagged(1<<20, 0, id)
	require.NoError(t, err)
	require.NoError(t, a.Free(p, 0, 0))
	require.NoError(t, a.EmptyCache())
	require.Eventually(t, func() bool { return be.allocs.Load() == 1 && be.frees.Load() == 1 }, 5*time.Second, time.Millisecond)
	require.Zero(t, be.liveCount())
}

// SYMMEM_BACKUP_PIN_AHEAD bounds the bytes pinned ahead; segments past the
// bound pin at their first pause, and the contents survive either way.
func TestPinAheadIsBounded(t *testing.T) {
	t.Setenv("SYMMEM_BACKUP_PIN_AHEAD", "30M")
	core.ReloadSettings()
	t.Cleanup(func() { core.ReloadSettings() })
	be := newPinningBackend(t, 0)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPinned)
	var ptrs []uintptr
	const n = 24 << 20
	for i := 0; i < 3; i++ {
		p, err := a.AllocTagged(n, 0, id)
		require.NoError(t, err)
		info, err := a.Lookup(p)
		require.NoError(t, err)
		require.EqualValues(t, n, info.Segment.Size, "one segment of its own")
		poke(t, a, p, byte(i+1), n)
		ptrs = append(ptrs, p)
	}
	require.Eventually(t, func() bool { return be.allocs.Load() == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	require.EqualValues(t, 1, be.allocs.Load(), "only the first segment fits under the bound")
	_, err := a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 3, be.allocs.Load(), "the others pinned at the pause")
	require.NoError(t, a.Validate())
	_, err = a.Resume(name)
	require.NoError(t, err)
	for i, p := range ptrs {
		require.Equal(t, byte(i+1), peek(t, a, p+n-1, 1)[0])
	}
}

// SYMMEM_BACKUP_PIN_AHEAD=0 turns pinning ahead off.
func TestPinAheadOff(t *testing.T) {
	t.Setenv("SYMMEM_BACKUP_PIN_AHEAD", "0")
	core.ReloadSettings()
	t.Cleanup(func() { core.ReloadSettings() })
	be := newPinningBackend(t, 0)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPinned)
	_, err := a.AllocTagged(1<<20, 0, id)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	require.Zero(t, be.allocs.Load())
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 1, be.allocs.Load())
}

// A pageable backup never uses the backend's pinned memory.
func TestPageableBackupIsNotPinned(t *testing.T) {
	be := newPinningBackend(t, 0)
	a := newAllocator(t, be)
	name, id := kindTag(t, "w", alloc.BackupPageable)
	p, err := a.AllocTagged(1<<20, 0, id)
	require.NoError(t, err)
	poke(t, a, p, 0x66, 1<<20)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	host, paused, err := a.BackupOf(p, 1<<20)
	require.NoError(t, err)
	require.True(t, paused)
	require.Equal(t, byte(0x66), hostByte(host))
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.Equal(t, byte(0x66), peek(t, a, p, 1)[0])
	require.Zero(t, be.allocs.Load(), "no pinned memory for a pageable backup")
}

// PauseDiscard drops a backup tag's contents for one pause (the resume
// zero-fills), PauseKeep keeps a copy of a tag without backup; BackupOf
// reports the copy the last pause made, or why there is none.
func TestPauseBackupOverrides(t *testing.T) {
	a := newAllocator(t, nil)
	wName, w := kindTag(t, "w", alloc.BackupPinned)
	kvName, kv := kindTag(t, "kv", alloc.BackupNone)
	pw, err := a.AllocTagged(1<<20, 0, w)
	require.NoError(t, err)
	pkv, err := a.AllocTagged(1<<20, 0, kv)
	require.NoError(t, err)

	_, _, err = a.BackupOf(pw, 16)
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err))
	require.Contains(t, err.Error(), "never paused")
	_, _, err = a.BackupOf(pkv, 16)
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err))
	require.Contains(t, err.Error(), "no backup")
	_, _, err = a.BackupOf(pw+1, 2<<20)
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "a range past the segment")
	_, _, err = a.BackupOf(4096, 1)
	require.Equal(t, core.ErrInvalidPointer, core.CodeOf(err))

	poke(t, a, pw, 0x11, 1<<20)
	poke(t, a, pkv, 0x22, 1<<20)
	_, err = a.Pause(wName, alloc.PauseOptions{Backup: alloc.PauseDiscard})
	require.NoError(t, err)
	_, _, err = a.BackupOf(pw, 16)
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err))
	require.Contains(t, err.Error(), "discarded")
	_, err = a.Pause(kvName, alloc.PauseOptions{Backup: alloc.PauseKeep})
	require.NoError(t, err)
	host, paused, err := a.BackupOf(pkv+100, 16)
	require.NoError(t, err)
	require.True(t, paused)
	require.Equal(t, byte(0x22), hostByte(host))
	_, err = a.Resume("")
	require.NoError(t, err)
	require.Equal(t, byte(0), peek(t, a, pw, 1)[0], "discarded: zero after the resume")
	require.Equal(t, byte(0x22), peek(t, a, pkv+(1<<20)-1, 1)[0], "kept: restored")
	_, paused, err = a.BackupOf(pkv, 16)
	require.NoError(t, err, "the copy stays after the resume")
	require.False(t, paused)

	// The next plain pause follows the tags again.
	poke(t, a, pw, 0x33, 1<<20)
	poke(t, a, pkv, 0x44, 1<<20)
	_, err = a.Pause("", alloc.PauseOptions{})
	require.NoError(t, err)
	_, err = a.Resume("")
	require.NoError(t, err)
	require.Equal(t, byte(0x33), peek(t, a, pw, 1)[0])
	require.Equal(t, byte(0), peek(t, a, pkv, 1)[0], "kv has no backup of its own")
	require.NoError(t, a.Validate())
}

func TestRegisterTagRefusesUnknownKinds(t *testing.T) {
	_, err := alloc.RegisterTag("kind-test", alloc.BackupKind(9))
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
	name, _ := kindTag(t, "k", alloc.BackupPageable)
	_, err = alloc.RegisterTag(name, alloc.BackupPinned)
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
	require.Contains(t, err.Error(), "pageable")
}

// hostByte reads the byte at a host address that Go does not manage.
func hostByte(addr uintptr) byte {
	return *(*byte)(unmanaged.Pointer(addr))
}

// countingBackend counts the Memset calls that reach the backend.
type countingBackend struct {
	core.Backend
	memsets atomic.Int64
}

func (b *countingBackend) Memset(dev int, s core.Stream, addr uintptr, v byte, n uintptr) error {
	b.memsets.Add(1)
	return b.Backend.Memset(dev, s, addr, v, n)
}

// ResumeOptions.NoFill skips the zero-fill of memory without a host copy,
// and still restores the copies.
func TestResumeWithoutFill(t *testing.T) {
	be := &countingBackend{Backend: testBackend(t)}
	a := newAllocator(t, be)
	kvName, kv := kindTag(t, "kv", alloc.BackupNone)
	wName, w := kindTag(t, "w", alloc.BackupPinned)
	p, err := a.AllocTagged(1<<20, 0, kv)
	require.NoError(t, err)
	q, err := a.AllocTagged(1<<20, 0, w)
	require.NoError(t, err)
	poke(t, a, q, 0x4d, 1<<20)
	for _, name := range []string{kvName, wName} {
		_, err = a.Pause(name, alloc.PauseOptions{})
		require.NoError(t, err)
	}
	before := be.memsets.Load()
	_, err = a.ResumeWith("", alloc.ResumeOptions{NoFill: true})
	require.NoError(t, err)
	require.Equal(t, before, be.memsets.Load(), "no zero-fill")
	require.Equal(t, byte(0x4d), peek(t, a, q+(1<<20)-1, 1)[0], "the copy is restored")
	_, err = a.Pause(kvName, alloc.PauseOptions{})
	require.NoError(t, err)
	_, err = a.Resume(kvName)
	require.NoError(t, err)
	require.Equal(t, before+1, be.memsets.Load(), "a plain resume zero-fills")
	require.Equal(t, byte(0), peek(t, a, p, 1)[0])
}

// A disk backup lives in an unlinked file of the backup directory: the
// contents survive the pause, the process does not keep the pages, and
// the file goes with the segment.
func TestDiskBackup(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, alloc.SetBackupDir(dir))
	t.Cleanup(func() { _ = alloc.SetBackupDir("") })
	a := newAllocator(t, nil)
	name, id := kindTag(t, "w", alloc.BackupDisk)
	const n = 3 << 20
	p, err := a.AllocTagged(n, 0, id)
	require.NoError(t, err)
	poke(t, a, p, 0x5e, n)
	for cycle := 0; cycle < 3; cycle++ {
		_, err = a.Pause(name, alloc.PauseOptions{})
		require.NoError(t, err)
		host, paused, err := a.BackupOf(p+n-1, 1)
		require.NoError(t, err)
		require.True(t, paused)
		require.Equal(t, byte(0x5e), hostByte(host), "the file holds the contents")
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Empty(t, entries, "the file is unlinked")
		_, err = a.Resume(name)
		require.NoError(t, err)
		require.Equal(t, byte(0x5e), peek(t, a, p, 1)[0], "cycle %d", cycle)
		require.Equal(t, byte(0x5e), peek(t, a, p+n-1, 1)[0], "cycle %d", cycle)
	}
	require.NoError(t, a.Free(p, 0, 0))
	require.NoError(t, a.EmptyCache())
}

func TestDiskBackupNeedsADirectory(t *testing.T) {
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(alloc.SetBackupDir("/proc/no/such/dir")))
	t.Setenv("SYMMEM_BACKUP_DIR", "/proc/self/no-such-dir")
	core.ReloadSettings()
	t.Cleanup(func() { core.ReloadSettings() })
	require.Equal(t, "/proc/self/no-such-dir", alloc.BackupDir())
	a := newAllocator(t, nil)
	name, id := kindTag(t, "w", alloc.BackupDisk)
	p, err := a.AllocTagged(1<<20, 0, id)
	require.NoError(t, err)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err))
	require.Contains(t, err.Error(), "SYMMEM_BACKUP_DIR")
	_, _, err = a.BackupOf(p, 1)
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err), "nothing was paused")
}

// mapCountingBackend counts the maps that reach the backend, and which of
// them were for the device alone.
type mapCountingBackend struct {
	core.Backend
	maps, ownDevice atomic.Int64
}

func (b *mapCountingBackend) Map(dev int, addr, size uintptr, m core.Memory) error {
	b.maps.Add(1)
	return b.Backend.Map(dev, addr, size, m)
}

func (b *mapCountingBackend) MapOwnDevice(dev int, addr, size uintptr, m core.Memory) error {
	b.ownDevice.Add(1)
	return b.Backend.Map(dev, addr, size, m)
}

// Segments of a tag registered with OwnDevice are mapped for their device
// alone, when made and at every resume; other memory as the backend's Map
// grants (Note [Own-device tags]). Every region of a tag asks the same.
func TestOwnDeviceTagsMapForTheirDeviceAlone(t *testing.T) {
	be := &mapCountingBackend{Backend: testBackend(t)}
	a := newAllocator(t, be)
	name := "own-" + t.Name()
	own, err := alloc.RegisterTagWith(name, alloc.TagOptions{Backup: alloc.BackupPinned, OwnDevice: true})
	require.NoError(t, err)
	_, shared := kindTag(t, "shared", alloc.BackupNone)

	p, err := a.AllocTagged(1<<20, 0, own)
	require.NoError(t, err)
	require.Equal(t, int64(1), be.ownDevice.Load(), "the own-device tag's new segment")
	require.Equal(t, int64(0), be.maps.Load())
	_, err = a.AllocTagged(1<<20, 0, shared)
	require.NoError(t, err)
	_, err = a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), be.ownDevice.Load())
	require.Equal(t, int64(2), be.maps.Load(), "the other tag's and the untagged segments")

	poke(t, a, p, 0x6e, 1<<20)
	_, err = a.Pause(name, alloc.PauseOptions{})
	require.NoError(t, err)
	_, err = a.Resume(name)
	require.NoError(t, err)
	require.Equal(t, int64(2), be.ownDevice.Load(), "the resume maps for the device alone")
	require.Equal(t, int64(2), be.maps.Load())
	require.Equal(t, byte(0x6e), peek(t, a, p+(1<<20)-1, 1)[0], "the copy is restored")

	_, err = alloc.RegisterTagWith(name, alloc.TagOptions{Backup: alloc.BackupPinned})
	require.Error(t, err)
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
	require.Contains(t, err.Error(), "own-device mapping true before")
	id, err := alloc.RegisterTagWith(name, alloc.TagOptions{Backup: alloc.BackupPinned, OwnDevice: true})
	require.NoError(t, err)
	require.Equal(t, own, id)
}
