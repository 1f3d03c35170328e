package symm

import (
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/stretchr/testify/require"
)

// symmem_handle_device_error reads the flag on the library's own stream,
// bounded: with the legacy default stream stuck on a wait that nothing
// satisfies (as after a peer's death), it still answers at once. (It copied
// on the legacy stream, and hung there.)
func TestDeviceErrorWithAStuckStream(t *testing.T) {
	be := faultBackend(t)
	if !be.Capabilities().StreamSignals {
		t.Skip("the flag is read on the calling thread here: no stream to be stuck")
	}
	e := &rankEnv{rt: alloc.NewRuntime(be), rank: 0, world: 1, name: "deverror-stuck", dir: sockDir(t), timeout: 3 * time.Second}
	a, err := e.rt.Allocator(0)
	require.NoError(t, err)
	h, fin, err := joinRendezvous(e, a, 64<<10)
	require.NoError(t, err)
	defer fin()
	// A word of the pad's user slots that nothing writes: the legacy
	// stream waits for it to become 1.
	word := h.padPtrs[0] + 4*5
	require.NoError(t, be.StreamMemOps(0, 0, []core.MemOp{{Addr: word, Value: 1, Wait: true}}, time.Second))
	unstick := func() {
		v := []uint32{1}
		pin := new(runtime.Pinner)
		pin.Pin(&v[0])
		unpinUnlessLate(pin, h.gm.copyOut(word, uintptr(unsafe.Pointer(&v[0])), 4))
	}
	defer unstick()
	type result struct {
		v   uint32
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := h.DeviceError()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.Zero(t, r.v)
	case <-time.After(10 * time.Second):
		unstick() // let the stuck read finish
		<-done
		t.Fatal("symmem_handle_device_error waited behind the stuck legacy stream")
	}
}
