package symm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/symm/coll"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// The copy-engine collectives on a backend with streams and copy engines
// (Note [Copy-engine collectives] in core/symm/coll): on the stand-in
// driver (make test-fakecuda) the stream memory operations and copies run
// on the stand-in's stream threads, whose device memory is the CPU's, so
// the test reads and writes it directly. Two ranks in this process.

// ceStreamBackend is what the test needs of the backend beyond core's.
type ceStreamBackend interface {
	core.CopyEngineRunner
	streamBackend
	Synchronize(device int, s core.Stream) error
}

// onTwoStreamRanks runs body as ranks 0 and 1 of group name, each on a
// device and a stream of its own, on the backend SYMMEM_BACKEND names;
// it skips where that backend has no copy engines on streams.
func onTwoStreamRanks(t *testing.T, name string, timeout time.Duration, body func(e *rankEnv, be ceStreamBackend, s core.Stream, a *alloc.Allocator) error) []error {
	// The test reads and writes device memory from the CPU, which only the
	// stand-in driver's memory allows; on GPUs the copy-engine collectives
	// are python/tests/test_copy_engine_gpu.py's.
	if !strings.Contains(filepath.Base(os.Getenv("SYMMEM_LIBCUDA")), "cuda_fake") && core.Current().Text("SYMMEM_BACKEND", "") != "host" {
		t.Skip("reads device memory from the CPU: runs on the stand-in driver (make test-fakecuda)")
	}
	be := faultBackend(t)
	sb, ok := be.(ceStreamBackend)
	if !ok || !be.Capabilities().StreamSignals || be.DeviceCount() < 2 {
		t.Skip("needs a backend with streams, copy engines and 2 devices (make test-fakecuda runs it on the stand-in driver)")
	}
	dir := sockDir(t)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		e := &rankEnv{rt: alloc.NewRuntime(be), rank: r, world: 2, name: name, dir: dir, timeout: timeout, device: r}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[e.rank] = func() error {
				a, err := e.rt.Allocator(e.device)
				if err != nil {
					return err
				}
				s, err := sb.NewStream(e.device)
				if err != nil {
					return err
				}
				defer sb.DestroyStream(e.device, s)
				return body(e, sb, s, a)
			}()
		}()
	}
	wg.Wait()
	return errs
}

// ceHandleAndOut is a rank's handle on a 64 KiB block and an output
// buffer of the same size on stream s; fin releases the handle.
func ceHandleAndOut(e *rankEnv, a *alloc.Allocator, s core.Stream) (*Handle, uintptr, func(), error) {
	h, fin, err := joinRendezvous(e, a, 64<<10)
	if err != nil {
		return nil, 0, nil, err
	}
	out, err := a.Alloc(64<<10, s)
	if err != nil {
		fin()
		return nil, 0, nil, err
	}
	return h, out, fin, nil
}

func TestCopyEngineOnStreams(t *testing.T) {
	errs := onTwoStreamRanks(t, "ce-streams", 20*time.Second, func(e *rankEnv, be ceStreamBackend, s core.Stream, a *alloc.Allocator) error {
		const size = 64 << 10
		buf, g, err := join(e, a, size)
		if err != nil {
			return err
		}
		defer g.Destroy()
		h, err := g.Rendezvous(buf + 4096)
		if err != nil {
			return err
		}
		defer h.Release()
		out, err := a.Alloc(size, s)
		if err != nil {
			return err
		}
		me := e.rank
		in := h.bufPtrs[me] + h.offset
		for call := 1; call <= 50; call++ {
			for _, n := range []int{4, 67, 1000} {
				for i := 0; i < 2*n; i++ {
					storeBits(core.Int32, in+uintptr(4*i), inputBits(core.Int32, me, i, call))
				}
				// all_gather out of place, then all_to_all, then all_gather
				// in place (rank 1's part of out is its input).
				if err := coll.Run(h, coll.Args{Kind: core.AllGather, DType: core.Int32, Algo: core.AlgoCopyEngine, Count: uintptr(n), Out: out, Stream: s}); err != nil {
					return err
				}
				if err := be.Synchronize(e.device, s); err != nil {
					return err
				}
				for p := 0; p < 2; p++ {
					for i := 0; i < n; i++ {
						if got, want := loadBits(core.Int32, out+uintptr(4*(p*n+i))), inputBits(core.Int32, p, i, call); got != want {
							return fmt.Errorf("rank %d call %d: all_gather element %d of rank %d is %#x, want %#x", me, call, i, p, got, want)
						}
					}
				}
				if err := coll.Run(h, coll.Args{Kind: core.AllToAll, DType: core.Int32, Algo: core.AlgoCopyEngine, Count: uintptr(n), Out: out, Stream: s}); err != nil {
					return err
				}
				if err := be.Synchronize(e.device, s); err != nil {
					return err
				}
				for p := 0; p < 2; p++ {
					for i := 0; i < n; i++ {
						if got, want := loadBits(core.Int32, out+uintptr(4*(p*n+i))), inputBits(core.Int32, p, me*n+i, call); got != want {
							return fmt.Errorf("rank %d call %d: all_to_all element %d from rank %d is %#x, want %#x", me, call, i, p, got, want)
						}
					}
				}
			}
		}
		// The stand-in runs no kernels: a reduction is refused before
		// anything is enqueued, so the group stays in step (the
		// all-gather after it meets the peer).
		err = coll.Run(h, coll.Args{Kind: core.AllReduce, DType: core.Float32, Algo: core.AlgoCopyEngine, Count: 64, Stream: s})
		if err == nil || !strings.Contains(err.Error(), "copy_engine reduces with a kernel, which cannot be had") {
			return fmt.Errorf("all_reduce on a driver without kernels: got %v", err)
		}
		if err := coll.Run(h, coll.Args{Kind: core.AllGather, DType: core.Int32, Algo: core.AlgoCopyEngine, Count: 16, Out: out, Stream: s}); err != nil {
			return err
		}
		return be.Synchronize(e.device, s)
	})
	require.NoError(t, errs[0], "rank 0")
	require.NoError(t, errs[1], "rank 1")
}

// A stream's wait has no timeout: the watchdog ends a call that did not
// finish within the group's timeout, stops the group naming why, and lets
// the stream go on (Note [Copy-engine collectives]). Rank 1 comes late
// (after rank 0's watchdog gave up: its call must not meet rank 0's
// released one, it fails naming rank 0), or calls with another count (a
// mismatch), at once or 300 ms after rank 0 (mismatch-late: rank 0's
// watchdog gives up first and marks its flag in rank 1's pad, which must
// still read as a mismatch).
func TestCopyEngineWatchdog(t *testing.T) {
	for _, what := range []string{"late", "mismatch", "mismatch-late"} {
		t.Run(what, func(t *testing.T) {
			done := make(chan struct{})
			var once sync.Once
			errs := onTwoStreamRanks(t, "ce-watch-"+what, 2*time.Second, func(e *rankEnv, be ceStreamBackend, s core.Stream, a *alloc.Allocator) error {
				h, out, fin, err := ceHandleAndOut(e, a, s)
				if err != nil {
					return err
				}
				defer fin()
				if e.rank == 1 && what == "late" {
					<-done
					// Rank 0's stream has drained and marked its opening
					// flag in our pad as given up: our call's opening wait
					// never passes, our watchdog names rank 0.
					time.Sleep(100 * time.Millisecond)
					t0 := time.Now()
					if err := coll.Run(h, coll.Args{Kind: core.AllGather, DType: core.Int32, Algo: core.AlgoCopyEngine, Count: 64, Out: out, Stream: s}); err != nil {
						return err
					}
					if err := be.Synchronize(e.device, s); err != nil {
						return err
					}
					if took := time.Since(t0); took < 2*time.Second {
						return fmt.Errorf("rank 1: the late call met rank 0's given-up one after %v", took)
					}
					err := coll.Run(h, coll.Args{Kind: core.AllGather, DType: core.Int32, Algo: core.AlgoCopyEngine, Count: 64, Out: out, Stream: s})
					if want := "collectives are stopped since rank 0 gave up a collective"; core.CodeOf(err) != core.ErrInvalidState || !strings.Contains(err.Error(), want) {
						return fmt.Errorf("rank 1: the call after the late one: got %v, want INVALID_STATE with %q", err, want)
					}
					return nil
				}
				defer once.Do(func() { time.Sleep(50 * time.Millisecond); close(done) })
				count := uintptr(64)
				if e.rank == 1 {
					count = 32
					if what == "mismatch-late" {
						time.Sleep(300 * time.Millisecond)
					}
				}
				t0 := time.Now()
				if err := coll.Run(h, coll.Args{Kind: core.AllGather, DType: core.Int32, Algo: core.AlgoCopyEngine, Count: count, Out: out, Stream: s}); err != nil {
					return err
				}
				// The stream moves on once the watchdog has given up.
				if err := be.Synchronize(e.device, s); err != nil {
					return err
				}
				if took := time.Since(t0); took < 2*time.Second || took > 15*time.Second {
					return fmt.Errorf("rank %d: the stuck call ended after %v, want the group's timeout (2s) and a little", e.rank, took)
				}
				err = coll.Run(h, coll.Args{Kind: core.AllGather, DType: core.Int32, Algo: core.AlgoCopyEngine, Count: count, Out: out, Stream: s})
				want := "timed out waiting for rank 1"
				if what != "late" {
					want = fmt.Sprintf("rank %d called a collective with other arguments than this rank", 1-e.rank)
				}
				if core.CodeOf(err) != core.ErrInvalidState || !strings.Contains(err.Error(), want) {
					return fmt.Errorf("rank %d: the call after the stuck one: got %v, want INVALID_STATE with %q", e.rank, err, want)
				}
				if v := *(*uint32)(unmanaged.Pointer(h.stopMirror)); v == 0 {
					return fmt.Errorf("rank %d: the stop mirror is not set", e.rank)
				}
				return nil
			})
			require.NoError(t, errs[0], "rank 0")
			require.NoError(t, errs[1], "rank 1")
		})
	}
}

// auto runs an all-gather of 2 ranks on the copy engines from
// CopyEngineAllGatherMinBytes per rank (Note [Copy-engine collectives]).
// The stand-in driver runs no kernels, so only the copy engines can give
// these results.
func TestAutoAllGatherOnCopyEngines(t *testing.T) {
	defer func(v uintptr) { coll.CopyEngineAllGatherMinBytes = v }(coll.CopyEngineAllGatherMinBytes)
	coll.CopyEngineAllGatherMinBytes = 1024
	errs := onTwoStreamRanks(t, "ce-auto", 20*time.Second, func(e *rankEnv, be ceStreamBackend, s core.Stream, a *alloc.Allocator) error {
		h, out, fin, err := ceHandleAndOut(e, a, s)
		if err != nil {
			return err
		}
		defer fin()
		const n = 1000 // 4000 bytes per rank
		in := h.bufPtrs[e.rank] + h.offset
		for i := 0; i < n; i++ {
			storeBits(core.Int32, in+uintptr(4*i), inputBits(core.Int32, e.rank, i, 1))
		}
		if err := coll.Run(h, coll.Args{Kind: core.AllGather, DType: core.Int32, Algo: core.AlgoAuto, Count: n, Out: out, Stream: s}); err != nil {
			return err
		}
		if err := be.Synchronize(e.device, s); err != nil {
			return err
		}
		for p := 0; p < 2; p++ {
			for i := 0; i < n; i++ {
				if got, want := loadBits(core.Int32, out+uintptr(4*(p*n+i))), inputBits(core.Int32, p, i, 1); got != want {
					return fmt.Errorf("rank %d: element %d of rank %d is %#x, want %#x", e.rank, i, p, got, want)
				}
			}
		}
		return nil
	})
	require.NoError(t, errs[0], "rank 0")
	require.NoError(t, errs[1], "rank 1")
}
