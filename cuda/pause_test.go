package cuda

import (
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A tag's pause and resume on the cuda backend (the fake driver in CI, a GPU
// under SYMMEM_REQUIRE_GPU=1): the backup goes through pinned host memory
// (cuMemHostAlloc), the contents come back at the same address, the tag
// without backup reads zero, and cuMemGetInfo's free memory rises by the
// paused bytes while paused.
func TestBackendPauseResume(t *testing.T) {
	b := requireGPU(t)
	a, err := alloc.NewAllocator(b, 0)
	require.NoError(t, err)
	defer a.Close()
	var _ core.HostMemory = b
	w, err := alloc.RegisterTag("cuda-test-weights", alloc.BackupPinned)
	require.NoError(t, err)
	kv, err := alloc.RegisterTag("cuda-test-kv", alloc.BackupNone)
	require.NoError(t, err)
	const n = 64 << 20
	pw, err := a.AllocTagged(n, 0, w)
	require.NoError(t, err)
	pkv, err := a.AllocTagged(n, 0, kv)
	require.NoError(t, err)
	require.NoError(t, b.Memset(0, 0, pw, 0x5c, n))
	require.NoError(t, b.Memset(0, 0, pkv, 0x7d, n))

	for cycle := 0; cycle < 3; cycle++ {
		free0, _, err := b.MemoryInfo(0)
		require.NoError(t, err)
		released, err := a.Pause("", alloc.PauseOptions{})
		require.NoError(t, err)
		require.GreaterOrEqual(t, released, uint64(2*n))
		free1, _, err := b.MemoryInfo(0)
		require.NoError(t, err)
		// Other processes may allocate on a real GPU meanwhile: allow 1/8 slack.
		require.GreaterOrEqual(t, int64(free1-free0), int64(released-released/8), "cycle %d: free memory %d -> %d", cycle, free0, free1)
		_, err = a.Resume("")
		require.NoError(t, err)
		requireAll(t, download(t, b, 0, pw, n), 0x5c, "the weights after resume")
		requireAll(t, download(t, b, 0, pkv, n), 0, "the KV cache (no backup) after resume")
		require.NoError(t, b.Memset(0, 0, pkv, 0x7d, n))
	}
	require.NoError(t, a.Validate())
	require.NoError(t, a.Free(pw, 0, 0))
	require.NoError(t, a.Free(pkv, 0, 0))
	require.NoError(t, a.EmptyCache())
}

// FillOrCopyWithin queues fills and copies in order on the library's own
// stream and waits once: a later op sees an earlier one's result.
func TestBackendFillOrCopyWithinRunsInOrder(t *testing.T) {
	b := requireGPU(t)
	a, err := alloc.NewAllocator(b, 0)
	require.NoError(t, err)
	defer a.Close()
	const n = 4 << 20
	p, err := a.Alloc(n, 0)
	require.NoError(t, err)
	q, err := a.Alloc(n, 0)
	require.NoError(t, err)
	ops := []core.FillOrCopy{
		{Dst: p, Size: n, Fill: true, Value: 0x3a},
		{Dst: q, Src: p, Size: n},
		{Dst: p, Size: n / 2, Fill: true, Value: 0x11},
		{Dst: p, Size: 0, Fill: true, Value: 0xff}, // nothing to do
	}
	require.NoError(t, b.FillOrCopyWithin(0, ops, core.DefaultTimeout()))
	requireAll(t, download(t, b, 0, q, n), 0x3a, "the copy ran after the first fill")
	requireAll(t, download(t, b, 0, p, n/2), 0x11, "the second fill ran last")
	requireAll(t, download(t, b, 0, p+n/2, n/2), 0x3a, "the rest of the first fill")
	require.NoError(t, b.FillOrCopyWithin(0, nil, core.DefaultTimeout()), "an empty batch")
	require.NoError(t, a.Free(p, 0, 0))
	require.NoError(t, a.Free(q, 0, 0))
}

// Pinning runs in the relaxed stream-capture mode, so that a graph captured
// in global mode on another thread neither forbids it nor is spoilt by it
// (the fake driver, with FAKECUDA_CAPTURING, refuses cuMemHostAlloc in any
// other mode).
func TestBackendAllocHostWhileAnotherThreadCaptures(t *testing.T) {
	b := requireGPU(t)
	if !isFake() {
		t.Skip("the fake driver imitates a capture on another thread")
	}
	t.Setenv("FAKECUDA_CAPTURING", "1")
	p, err := b.AllocHost(0, 1<<20)
	require.NoError(t, err)
	require.NoError(t, b.FreeHost(0, p, 1<<20))
}

// An op that the driver refuses stops a FillOrCopyWithin batch; when the
// wait for the ops queued before it then times out, the error is
// ErrTimeout (naming both causes), not the refusal: the caller must learn
// that those ops may still run, and keep their memory (a resume unmaps
// the new memory on any other error).
func TestBackendFillOrCopyWithinRefusedOpOnStuckStream(t *testing.T) {
	b := requireGPU(t)
	if !isFake() {
		t.Skip("the fake driver refuses an op on a NULL address at queueing time")
	}
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	s := newSegment(t, b, 0, gran)
	require.NoError(t, b.Memset(0, 0, s.addr, 0, 64))
	d, err := b.device(0)
	require.NoError(t, err)
	own, err := b.ownStream(d)
	require.NoError(t, err)
	// The library's own stream waits for a value nobody writes yet.
	require.NoError(t, b.WaitValue32(0, core.Stream(own), s.addr, 1, time.Second))
	ops := []core.FillOrCopy{
		{Dst: s.addr + 64, Size: 64, Fill: true, Value: 0x42},
		{Dst: 0, Size: 64, Fill: true, Value: 0x43}, // refused
	}
	err = b.FillOrCopyWithin(0, ops, 300*time.Millisecond)
	require.Equal(t, core.ErrTimeout, core.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "cuMemsetD8Async", "the refusal is named too")

	other, err := b.NewStream(0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, b.DestroyStream(0, other)) })
	require.NoError(t, b.WriteValue32(0, other, s.addr, 1)) // the value arrives
	require.NoError(t, b.SynchronizeDevice(0))
	requireAll(t, download(t, b, 0, s.addr+64, 64), 0x42, "the op queued before the refused one ran once the stream went on")
}
