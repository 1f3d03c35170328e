package alloc_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
)

// twoDevices shows one device of a backend as two (every call goes to
// device 0; each allocator reserves its own range), so that the policy of
// Runtime.PauseTag runs over several devices on any backend. A Create on
// device 1 while hold is set waits until release is closed, holding that
// allocator's lock: entered says it has started.
type twoDevices struct {
	core.Backend
	mu      sync.Mutex
	hold    bool
	entered chan struct{}
	release chan struct{}
}

func (b *twoDevices) DeviceCount() int                             { return 2 }
func (b *twoDevices) Granularity(int) (uintptr, error)             { return b.Backend.Granularity(0) }
func (b *twoDevices) MemoryInfo(int) (uint64, uint64, error)       { return b.Backend.MemoryInfo(0) }
func (b *twoDevices) Reserve(_ int, size uintptr) (uintptr, error) { return b.Backend.Reserve(0, size) }
func (b *twoDevices) Unreserve(_ int, addr, size uintptr) error {
	return b.Backend.Unreserve(0, addr, size)
}
func (b *twoDevices) Map(_ int, addr, size uintptr, m core.Memory) error {
	return b.Backend.Map(0, addr, size, m)
}
func (b *twoDevices) Unmap(_ int, addr, size uintptr) error     { return b.Backend.Unmap(0, addr, size) }
func (b *twoDevices) Import(_ int, fd int) (core.Memory, error) { return b.Backend.Import(0, fd) }
func (b *twoDevices) SynchronizeDevice(int) error               { return b.Backend.SynchronizeDevice(0) }
func (b *twoDevices) StreamWait(_ int, w, o core.Stream) error  { return b.Backend.StreamWait(0, w, o) }
func (b *twoDevices) Memset(_ int, s core.Stream, addr uintptr, v byte, n uintptr) error {
	return b.Backend.Memset(0, s, addr, v, n)
}
func (b *twoDevices) Copy(_ int, s core.Stream, dst, src, n uintptr) error {
	return b.Backend.Copy(0, s, dst, src, n)
}
func (b *twoDevices) StreamMemOps(_ int, s core.Stream, ops []core.MemOp, timeout time.Duration) error {
	return b.Backend.StreamMemOps(0, s, ops, timeout)
}

func (b *twoDevices) Create(device int, size uintptr) (core.Memory, error) {
	b.mu.Lock()
	hold := b.hold && device == 1
	if hold {
		b.hold = false
	}
	b.mu.Unlock()
	if hold {
		close(b.entered)
		<-b.release
	}
	return b.Backend.Create(0, size)
}

// Two goroutines pause one tag at once, on two devices, one keeping a copy
// and one discarding it: exactly one pauses it, on every device, and the
// other returns ErrInvalidState saying that it is already paused (Note
// [Pausing every device]); after a resume the contents are what the
// winner's option says, on every device. Each round lines both pauses up
// behind an allocation on device 1 that holds that device's lock. Without
// one lock over the whole pause (state read, lock dropped, then paused),
// both found the tag live on device 1 after one of them had paused device
// 0: each paused a device with its own option and both succeeded, or the
// slower one failed with ErrInvalidState after pausing device 0 itself.
func TestConcurrentPausesOfOneTag(t *testing.T) {
	be := &twoDevices{Backend: testBackend(t)}
	rt := alloc.NewRuntime(be)
	var as [2]*alloc.Allocator
	for d := range as {
		a, err := rt.Allocator(d)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, a.Close()) })
		as[d] = a
	}
	const n = 4096
	for round := 0; round < 8; round++ {
		name, id := tag(t, fmt.Sprintf("both%d", round), false)
		var ptrs [2]uintptr
		for d, a := range as {
			p, err := a.AllocTagged(n, 0, id)
			require.NoError(t, err)
			poke(t, a, p, 0x5a, n)
			ptrs[d] = p
		}
		// An untagged allocation on device 1 that needs a new segment (the
		// last round's went back with EmptyCache) holds device 1's lock
		// until release.
		be.entered, be.release = make(chan struct{}), make(chan struct{})
		be.mu.Lock()
		be.hold = true
		be.mu.Unlock()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := as[1].Alloc(12<<20, 0)
			if assert.NoError(t, err) {
				assert.NoError(t, as[1].Free(p, 0, 0))
				assert.NoError(t, as[1].EmptyCache())
			}
		}()
		<-be.entered
		opts := []alloc.PauseBackup{alloc.PauseKeep, alloc.PauseDiscard}
		errs := make([]error, len(opts))
		for i, o := range opts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = rt.PauseTag(chooseTag(t, name), alloc.PauseOptions{Backup: o})
			}()
		}
		time.Sleep(20 * time.Millisecond) // both pauses are waiting by now
		close(be.release)
		wg.Wait()

		won := -1
		for i, err := range errs {
			if err == nil {
				require.Equal(t, -1, won, "round %d: both pauses succeeded", round)
				won = i
				continue
			}
			require.Equal(t, core.ErrInvalidState, core.CodeOf(err), "round %d: %v", round, err)
			require.Contains(t, err.Error(), "already paused", "round %d", round)
		}
		require.NotEqual(t, -1, won, "round %d: neither pause succeeded: %v", round, errs)
		require.NoError(t, rt.ResumeTag(chooseTag(t, name), alloc.ResumeOptions{}))
		want := byte(0x5a)
		if opts[won] == alloc.PauseDiscard {
			want = 0
		}
		for d, a := range as {
			got := peek(t, a, ptrs[d], n)
			require.Equal(t, want, got[0], "round %d, device %d: the winner (%v) decides every device", round, d, opts[won])
			require.Equal(t, want, got[n-1], "round %d, device %d", round, d)
			require.NoError(t, a.Validate())
		}
	}
}

// chooseTag resolves name, which a region registered.
func chooseTag(t *testing.T, name string) alloc.TagChoice {
	c, err := alloc.ChooseTag(name)
	require.NoError(t, err)
	return c
}
