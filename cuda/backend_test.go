package cuda

// The GPU suite: every TestBackend* test opens the backend from
// LibraryPath() and skips, saying why, when that fails (no driver, no
// device); with SYMMEM_REQUIRE_GPU=1 it fails instead. fake_test.go runs
// the same tests against testdata/fakecuda.c in a child process, so they
// also run on machines without a GPU.
//
// On a GPU machine:  SYMMEM_REQUIRE_GPU=1 go test -v -count=1 ./cuda/

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
)

const envRequireGPU = "SYMMEM_REQUIRE_GPU"

// requireGPU opens the backend or skips the test with the reason; with
// SYMMEM_REQUIRE_GPU=1 a failure to open fails the test. The backend is
// closed when the test ends.
func requireGPU(t *testing.T) *Backend {
	t.Helper()
	b, err := New()
	if err != nil {
		if os.Getenv(envRequireGPU) == "1" {
			t.Fatalf("%s=1 but the cuda backend cannot be opened: %v", envRequireGPU, err)
		}
		t.Skipf("no CUDA: %v", err)
	}
	t.Cleanup(func() { assert.NoError(t, b.Close(), "Close") })
	return b
}

// isFake tells whether the suite runs against testdata/fakecuda.c.
func isFake() bool { return os.Getenv(envFake) == "1" }

// segment is physical memory mapped at a reserved range of its own.
type segment struct {
	dev        int
	addr, size uintptr
	mem        core.Memory
}

// newSegment creates size bytes on dev and maps them; the test's cleanup
// unmaps, releases and unreserves them.
func newSegment(t *testing.T, b *Backend, dev int, size uintptr) *segment {
	t.Helper()
	mem, err := b.Create(dev, size)
	require.NoError(t, err, "Create")
	return mapSegment(t, b, dev, size, mem)
}

// mapSegment maps mem (size bytes) at a new reserved range on dev and
// registers the cleanup (unmap, release, unreserve).
func mapSegment(t *testing.T, b *Backend, dev int, size uintptr, mem core.Memory) *segment {
	t.Helper()
	addr, err := b.Reserve(dev, size)
	require.NoError(t, err, "Reserve")
	require.NoError(t, b.Map(dev, addr, size, mem), "Map")
	t.Cleanup(func() {
		assert.NoError(t, b.Unmap(dev, addr, size), "Unmap")
		assert.NoError(t, b.Release(mem), "Release")
		assert.NoError(t, b.Unreserve(dev, addr, size), "Unreserve")
	})
	return &segment{dev: dev, addr: addr, size: size, mem: mem}
}

// hostBuffer is n bytes of Go memory pinned for the test, and its address.
func hostBuffer(t *testing.T, n uintptr) ([]byte, uintptr) {
	buf := make([]byte, n)
	var p runtime.Pinner
	p.Pin(&buf[0])
	t.Cleanup(p.Unpin)
	return buf, uintptr(unsafe.Pointer(&buf[0]))
}

// download copies n bytes at addr on dev to a new host slice (stream 0).
func download(t *testing.T, b *Backend, dev int, addr, n uintptr) []byte {
	t.Helper()
	buf, p := hostBuffer(t, n)
	require.NoError(t, b.Copy(dev, 0, p, addr, n), "Copy device to host")
	return buf
}

// upload copies data to addr on dev (stream 0).
func upload(t *testing.T, b *Backend, dev int, addr uintptr, data []byte) {
	t.Helper()
	buf, p := hostBuffer(t, uintptr(len(data)))
	copy(buf, data)
	require.NoError(t, b.Copy(dev, 0, addr, p, uintptr(len(data))), "Copy host to device")
}

// requireAll checks that every byte of got is want, reporting the first that is not.
func requireAll(t *testing.T, got []byte, want byte, what string) {
	t.Helper()
	for i, v := range got {
		if v != want {
			t.Fatalf("%s: byte %d of %d is %#x, want %#x", what, i, len(got), v, want)
		}
	}
}

// within runs f and fails the test if it does not return within d: a stream
// wait that never ends must fail the test, not hang it.
func within(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		require.NoError(t, err, what)
	case <-time.After(d):
		t.Fatalf("%s did not finish within %v (a stream wait never saw its value?)", what, d)
	}
}

func TestBackendDevices(t *testing.T) {
	b := requireGPU(t)
	v, err := DriverVersion()
	require.NoError(t, err)
	t.Logf("driver %s supports CUDA %d.%d, %d device(s)", b.Library(), v/1000, v%1000/10, b.DeviceCount())
	assert.Equal(t, "cuda", b.Name())
	require.Positive(t, b.DeviceCount())

	seen := map[UUID]int{}
	for dev := 0; dev < b.DeviceCount(); dev++ {
		name, err := DeviceName(dev)
		require.NoError(t, err)
		assert.NotEmpty(t, name)
		uuid, err := DeviceUUID(dev)
		require.NoError(t, err)
		assert.NotEqual(t, UUID{}, uuid, "device %d has a zero UUID", dev)
		if other, dup := seen[uuid]; dup {
			t.Errorf("devices %d and %d share UUID %v", other, dev, uuid)
		}
		seen[uuid] = dev

		gran, err := b.Granularity(dev)
		require.NoError(t, err)
		assert.True(t, gran > 0 && gran&(gran-1) == 0, "granularity %d is not a power of two", gran)
		free, total, err := b.MemoryInfo(dev)
		require.NoError(t, err)
		assert.Positive(t, total)
		assert.LessOrEqual(t, free, total)
		self, err := CanAccessPeer(dev, dev)
		require.NoError(t, err)
		assert.True(t, self)
		t.Logf("device %d: %s %v, granularity %d KiB, %d of %d MiB free",
			dev, name, uuid, gran>>10, free>>20, total>>20)
	}
	if b.DeviceCount() >= 2 {
		can, err := CanAccessPeer(0, 1)
		require.NoError(t, err)
		t.Logf("device 0 can access device 1: %v", can)
	}
}

func TestBackendCreateMapMemsetCopy(t *testing.T) {
	b := requireGPU(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	s := newSegment(t, b, 0, 2*gran)

	// Whole segment, then its first half.
	require.NoError(t, b.Memset(0, 0, s.addr, 0xAB, s.size))
	requireAll(t, download(t, b, 0, s.addr, s.size), 0xAB, "after Memset 0xAB")
	require.NoError(t, b.Memset(0, 0, s.addr, 0x11, gran))
	got := download(t, b, 0, s.addr, s.size)
	requireAll(t, got[:gran], 0x11, "first half after Memset 0x11")
	requireAll(t, got[gran:], 0xAB, "second half after Memset 0x11")

	// A pattern across the middle, uploaded and read back.
	pattern := make([]byte, 1<<20)
	for i := range pattern {
		pattern[i] = byte(i*7 + i>>8)
	}
	mid := s.addr + gran - uintptr(len(pattern))/2
	upload(t, b, 0, mid, pattern)
	assert.True(t, bytes.Equal(pattern, download(t, b, 0, mid, uintptr(len(pattern)))), "pattern read back differs")

	// Device to device.
	require.NoError(t, b.Copy(0, 0, s.addr, mid, uintptr(len(pattern))))
	assert.True(t, bytes.Equal(pattern, download(t, b, 0, s.addr, uintptr(len(pattern)))), "device-to-device copy differs")

	// Zero sizes are no-ops.
	require.NoError(t, b.Memset(0, 0, s.addr, 0, 0))
	require.NoError(t, b.Copy(0, 0, s.addr, s.addr, 0))

	fabric, why, err := b.FabricHandles(0)
	require.NoError(t, err)
	t.Logf("fabric handles on device 0: %v %s", fabric, why)
	if isFake() {
		// The fake refuses fabric handles like the H200s without IMEX do:
		// Create must have fallen back to POSIX file descriptors.
		assert.False(t, fabric)
		assert.Contains(t, why, "CUDA_ERROR_NOT_PERMITTED")
	}
}

func TestBackendExportImportSameProcess(t *testing.T) {
	b := requireGPU(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	s1 := newSegment(t, b, 0, gran)

	fd, err := b.Export(s1.mem)
	require.NoError(t, err)
	require.GreaterOrEqual(t, fd, 0)
	m2, err := b.Import(0, fd)
	require.NoError(t, err)
	s2 := mapSegment(t, b, 0, gran, m2)
	require.NotEqual(t, s1.addr, s2.addr)

	require.NoError(t, b.Memset(0, 0, s1.addr, 0x5C, gran))
	requireAll(t, download(t, b, 0, s2.addr, gran), 0x5C, "written at the first mapping, read at the second")
	require.NoError(t, b.Memset(0, 0, s2.addr+gran/2, 0xC5, gran/2))
	got := download(t, b, 0, s1.addr, gran)
	requireAll(t, got[:gran/2], 0x5C, "first half at the first mapping")
	requireAll(t, got[gran/2:], 0xC5, "written at the second mapping, read at the first")

	// Import takes ownership of the descriptor even when it fails.
	null, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	require.NoError(t, err)
	_, err = b.Import(0, null)
	require.Error(t, err, "importing /dev/null must fail")
	t.Logf("Import of /dev/null: %v", err)
	assert.False(t, fdIsOpen(null), "Import must close the descriptor it was given")
}

// TestBackendCrossProcess exports memory to a child process (the test binary
// run as TestChildImport), which maps it, checks what the parent wrote and
// writes something back.
func TestBackendCrossProcess(t *testing.T) {
	b := requireGPU(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	s := newSegment(t, b, 0, gran)
	require.NoError(t, b.Memset(0, 0, s.addr, 0x3C, gran))

	fd, err := b.Export(s.mem)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "exported segment")
	defer f.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestChildImport$", "-test.count=1", "-test.v")
	cmd.ExtraFiles = []*os.File{f} // fd 3 in the child
	cmd.Env = append(os.Environ(), envChild+"=1", envChildSize+"="+strconv.FormatUint(uint64(gran), 10))
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	require.NoError(t, err, "child process failed")
	require.Contains(t, string(out), "--- PASS: TestChildImport", "the child test did not run")

	requireAll(t, download(t, b, 0, s.addr, gran), 0xC3, "written by the child process")
}

const (
	envChild     = "SYMMEM_CUDA_TEST_CHILD"
	envChildSize = "SYMMEM_CUDA_TEST_CHILD_SIZE"
)

// TestChildImport is the child of TestBackendCrossProcess; it skips unless
// run as that child.
func TestChildImport(t *testing.T) {
	if os.Getenv(envChild) != "1" {
		t.Skip("runs only as the child of TestBackendCrossProcess")
	}
	size, err := strconv.ParseUint(os.Getenv(envChildSize), 10, 64)
	require.NoError(t, err)
	b, err := New()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, b.Close()) }) // after mapSegment's cleanup
	m, err := b.Import(0, 3)
	require.NoError(t, err)
	s := mapSegment(t, b, 0, uintptr(size), m)
	requireAll(t, download(t, b, 0, s.addr, s.size), 0x3C, "written by the parent process")
	require.NoError(t, b.Memset(0, 0, s.addr, 0xC3, s.size))
	require.NoError(t, b.SynchronizeDevice(0))
}

// TestBackendStreamOps checks WaitValue32, WriteValue32 and StreamWait in
// stream order across three non-blocking streams:
//
//	A: wait flag==1, then data=42
//	C: wait for A's work so far (StreamWait), then data2=7
//	B: flag=1 (only after checking that data and data2 are still 0)
func TestBackendStreamOps(t *testing.T) {
	b := requireGPU(t)
	s := zeroedSegment(t, b)
	flag, data, data2, word := s.addr, s.addr+64, s.addr+128, s.addr+192

	sA, sB, sC := newStream(t, b, 0), newStream(t, b, 0), newStream(t, b, 0)

	require.NoError(t, b.WaitValue32(0, sA, flag, 1, time.Second))
	require.NoError(t, b.WriteValue32(0, sA, data, 42))
	require.NoError(t, b.StreamWait(0, sC, sA))
	require.NoError(t, b.WriteValue32(0, sC, data2, 7))

	time.Sleep(100 * time.Millisecond) // give a broken wait the chance to let writes through
	got := download(t, b, 0, s.addr, 256)
	assert.Equal(t, uint32(0), le32(got[64:]), "data was written before the flag was set: WaitValue32 did not wait")
	assert.Equal(t, uint32(0), le32(got[128:]), "data2 was written before A's work: StreamWait did not wait")

	require.NoError(t, b.WriteValue32(0, sB, flag, 1))
	within(t, 30*time.Second, "Synchronize(A)", func() error { return b.Synchronize(0, sA) })
	within(t, 30*time.Second, "Synchronize(C)", func() error { return b.Synchronize(0, sC) })
	got = download(t, b, 0, s.addr, 256)
	assert.Equal(t, uint32(1), le32(got[0:]), "flag")
	assert.Equal(t, uint32(42), le32(got[64:]), "data")
	assert.Equal(t, uint32(7), le32(got[128:]), "data2")

	// The legacy default stream, and StreamWait of a stream on itself.
	require.NoError(t, b.StreamWait(0, sA, sA))
	require.NoError(t, b.WriteValue32(0, 0, word, 0xDEADBEEF))
	require.NoError(t, b.Synchronize(0, 0))
	assert.Equal(t, uint32(0xDEADBEEF), le32(download(t, b, 0, word, 4)))
	within(t, 30*time.Second, "SynchronizeDevice", func() error { return b.SynchronizeDevice(0) })
}

// fdIsOpen tells whether fd is an open descriptor (fcntl F_GETFD; closing
// it to find out could close a descriptor the driver opened meanwhile).
func fdIsOpen(fd int) bool {
	_, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
	return errno == 0
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func TestBackendBadDevice(t *testing.T) {
	b := requireGPU(t)
	n := b.DeviceCount()
	wantRange := fmt.Sprintf("valid devices are 0..%d", n-1)
	for _, dev := range []int{-1, n, n + 7} {
		checks := map[string]error{}
		_, checks["Granularity"] = b.Granularity(dev)
		_, _, checks["MemoryInfo"] = b.MemoryInfo(dev)
		_, checks["Reserve"] = b.Reserve(dev, 2<<20)
		checks["Unreserve"] = b.Unreserve(dev, 0, 2<<20)
		_, checks["Create"] = b.Create(dev, 2<<20)
		checks["Map"] = b.Map(dev, 0, 2<<20, 1)
		checks["Unmap"] = b.Unmap(dev, 0, 2<<20)
		checks["Synchronize"] = b.Synchronize(dev, 0)
		checks["SynchronizeDevice"] = b.SynchronizeDevice(dev)
		checks["StreamWait"] = b.StreamWait(dev, 0, 0)
		checks["Memset"] = b.Memset(dev, 0, 0, 0, 1)
		checks["Copy"] = b.Copy(dev, 0, 0, 0, 1)
		checks["WriteValue32"] = b.WriteValue32(dev, 0, 0, 1)
		checks["WaitValue32"] = b.WaitValue32(dev, 0, 0, 1, time.Second)
		_, checks["NewStream"] = b.NewStream(dev)
		_, checks["DeviceName"] = DeviceName(dev)
		_, checks["DeviceUUID"] = DeviceUUID(dev)
		_, checks["CanAccessPeer"] = CanAccessPeer(0, dev)

		fd, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		require.NoError(t, err)
		_, checks["Import"] = b.Import(dev, fd)
		assert.False(t, fdIsOpen(fd), "Import on a bad device must still close the descriptor")

		for name, err := range checks {
			if assert.Error(t, err, "%s(device %d)", name, dev) {
				assert.Equal(t, core.ErrInvalidDevice, core.CodeOf(err), "%s(device %d): %v", name, dev, err)
				assert.Contains(t, err.Error(), wantRange, "%s(device %d)", name, dev)
			}
		}
	}
	_, err := b.Granularity(-1)
	t.Logf("for example: %v", err)
}

func TestBackendReleaseAfterUnmap(t *testing.T) {
	b := requireGPU(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	addr, err := b.Reserve(0, gran)
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Unreserve(0, addr, gran)) }()

	// Map, use, unmap, release: the normal order.
	m, err := b.Create(0, gran)
	require.NoError(t, err)
	require.NoError(t, b.Map(0, addr, gran, m))
	require.NoError(t, b.Memset(0, 0, addr, 0x42, gran))
	require.NoError(t, b.Unmap(0, addr, gran))
	require.NoError(t, b.Release(m))

	// A released handle is refused before it reaches the driver.
	for name, err := range map[string]error{
		"Release": b.Release(m),
		"Map":     b.Map(0, addr, gran, m),
	} {
		assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%s of a released handle: %v", name, err)
	}
	_, err = b.Export(m)
	assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "Export of a released handle: %v", err)

	// Release while mapped is allowed: the memory lives until the unmap.
	m, err = b.Create(0, gran)
	require.NoError(t, err)
	require.NoError(t, b.Map(0, addr, gran, m))
	require.NoError(t, b.Release(m))
	require.NoError(t, b.Memset(0, 0, addr, 0x24, gran))
	requireAll(t, download(t, b, 0, addr, gran), 0x24, "memory released while mapped")
	require.NoError(t, b.Unmap(0, addr, gran))
}

func TestBackendInvalidArguments(t *testing.T) {
	b := requireGPU(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	for name, size := range map[string]uintptr{"zero": 0, "unaligned": gran + 1, "half": gran / 2} {
		_, err := b.Create(0, size)
		assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "Create %s: %v", name, err)
		_, err = b.Reserve(0, size)
		assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "Reserve %s: %v", name, err)
	}
	_, err = b.Import(0, -1)
	assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
	assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(b.DestroyStream(0, 0)))
}

func TestBackendOutOfMemory(t *testing.T) {
	b := requireGPU(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	_, total, err := b.MemoryInfo(0)
	require.NoError(t, err)
	size := (uintptr(total)*2 + gran - 1) / gran * gran
	_, err = b.Create(0, size)
	require.Error(t, err)
	t.Logf("Create of %d GiB: %v", size>>30, err)
	assert.Equal(t, core.ErrOutOfMemory, core.CodeOf(err))
	assert.Contains(t, err.Error(), "cuda: cuMemCreate failed on device 0: CUDA_ERROR_OUT_OF_MEMORY")
}

// TestBackendContexts checks Note [contexts] on one OS thread: a thread
// with no current context gets none back, and a thread with another
// context current (another device's, as a PyTorch thread would have) gets
// that one back.
func TestBackendContexts(t *testing.T) {
	b := requireGPU(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	s := newSegment(t, b, 0, gran)

	// Runs on one locked OS thread; assert, not require: FailNow must not be
	// called from a goroutine other than the test's.
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // the thread exits with the goroutine, context and all
		if !assert.NoError(t, setCurrentContext(0)) {
			return
		}
		assert.NoError(t, b.Memset(0, 0, s.addr, 1, gran))
		cur, err := currentContext()
		assert.NoError(t, err)
		assert.Zero(t, cur, "a thread without a context must be left without one")

		ctx0, err := b.primaryContext(0)
		if !assert.NoError(t, err) || !assert.NoError(t, setCurrentContext(ctx0)) {
			return
		}
		assert.NoError(t, b.Memset(0, 0, s.addr, 2, gran))
		cur, _ = currentContext()
		assert.Equal(t, ctx0, cur, "the device's own context must stay current")

		if b.DeviceCount() >= 2 {
			ctx1, err := b.primaryContext(1)
			if !assert.NoError(t, err) || !assert.NoError(t, setCurrentContext(ctx1)) {
				return
			}
			assert.NoError(t, b.Memset(0, 0, s.addr, 3, gran))
			_, _, err = b.MemoryInfo(0)
			assert.NoError(t, err)
			cur, _ = currentContext()
			assert.Equal(t, ctx1, cur, "another device's context must be put back")
		}
	}()
	<-done
	want := byte(2)
	if b.DeviceCount() >= 2 {
		want = 3
	}
	requireAll(t, download(t, b, 0, s.addr, gran), want, "after memsets from a locked thread")
}

// TestBackendConcurrent runs whole segment lifecycles from many goroutines.
func TestBackendConcurrent(t *testing.T) {
	b := requireGPU(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			buf := make([]byte, 4096)
			var pin runtime.Pinner
			pin.Pin(&buf[0])
			defer pin.Unpin()
			for i := 0; i < 10; i++ {
				if err := lifecycle(b, gran, byte(g*16+i), buf); err != nil {
					errs <- fmt.Errorf("goroutine %d iteration %d: %w", g, i, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// lifecycle creates, maps, fills, checks, unmaps and releases one segment.
func lifecycle(b *Backend, gran uintptr, v byte, buf []byte) error {
	m, err := b.Create(0, gran)
	if err != nil {
		return err
	}
	addr, err := b.Reserve(0, gran)
	if err != nil {
		return err
	}
	if err := b.Map(0, addr, gran, m); err != nil {
		return err
	}
	if err := b.Memset(0, 0, addr, v, gran); err != nil {
		return err
	}
	host := uintptr(unsafe.Pointer(&buf[0]))
	if err := b.Copy(0, 0, host, addr+gran-uintptr(len(buf)), uintptr(len(buf))); err != nil {
		return err
	}
	for i, got := range buf {
		if got != v {
			return fmt.Errorf("byte %d is %#x, want %#x", i, got, v)
		}
	}
	if err := b.Unmap(0, addr, gran); err != nil {
		return err
	}
	if err := b.Release(m); err != nil {
		return err
	}
	return b.Unreserve(0, addr, gran)
}

// TestBackendPeerMapping maps device 0's memory on device 1 (NVLink or PCIe
// P2P) through export and import, as two ranks on two GPUs would.
func TestBackendPeerMapping(t *testing.T) {
	b := requireGPU(t)
	if b.DeviceCount() < 2 {
		t.Skipf("needs 2 devices, have %d", b.DeviceCount())
	}
	can, err := CanAccessPeer(1, 0)
	require.NoError(t, err)
	if !can {
		t.Skip("device 1 cannot access device 0's memory")
	}
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	gran1, err := b.Granularity(1)
	require.NoError(t, err)
	require.Equal(t, gran, gran1)

	s0 := newSegment(t, b, 0, gran)
	require.NoError(t, b.Memset(0, 0, s0.addr, 0x77, gran))
	fd, err := b.Export(s0.mem)
	require.NoError(t, err)
	m1, err := b.Import(1, fd)
	require.NoError(t, err)
	s1 := mapSegment(t, b, 1, gran, m1)

	requireAll(t, download(t, b, 1, s1.addr, gran), 0x77, "device 0's memory read through device 1")
	st, err := b.NewStream(1)
	require.NoError(t, err)
	defer b.DestroyStream(1, st)
	require.NoError(t, b.WriteValue32(1, st, s1.addr, 0xFEEDF00D))
	require.NoError(t, b.Synchronize(1, st))
	assert.Equal(t, uint32(0xFEEDF00D), le32(download(t, b, 0, s0.addr, 4)), "written by device 1, read by device 0")
}

// requirePeerGPUs is requireGPU where device 1 can access device 0's
// memory directly; it skips otherwise.
func requirePeerGPUs(t *testing.T) *Backend {
	t.Helper()
	b := requireGPU(t)
	if b.DeviceCount() < 2 {
		t.Skipf("needs 2 devices, have %d", b.DeviceCount())
	}
	if can, err := CanAccessPeer(1, 0); err != nil || !can {
		t.Skipf("device 1 cannot access device 0's memory (%v)", err)
	}
	return b
}

// TestBackendMappingGrantsPeerAccess: memory mapped on device 0 is usable
// from device 1's context at the same address (PyTorch copies between GPUs
// with peer kernels, which fault on VMM memory that grants no access).
func TestBackendMappingGrantsPeerAccess(t *testing.T) {
	b := requirePeerGPUs(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	s0 := newSegment(t, b, 0, gran)
	require.NoError(t, b.Memset(0, 0, s0.addr, 0x11, gran))
	require.NoError(t, b.Memset(1, 0, s0.addr, 0x5a, gran), "device 1 writes device 0's mapping")
	requireAll(t, download(t, b, 0, s0.addr, gran), 0x5a, "device 1's write read on device 0")
}

// TestBackendMapOwnDeviceGrantsItsDeviceAlone: Map grants the peer GPU
// read-write access, MapOwnDevice only the device itself (Note [Own-device
// tags] in core/alloc); a map after an unmap grants afresh.
func TestBackendMapOwnDeviceGrantsItsDeviceAlone(t *testing.T) {
	b := requirePeerGPUs(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	shared := newSegment(t, b, 0, gran)
	own, err := b.AccessOf(0, shared.addr, 0)
	require.NoError(t, err)
	peer, err := b.AccessOf(0, shared.addr, 1)
	require.NoError(t, err)
	assert.True(t, own, "Map: device 0's access to its own mapping")
	assert.True(t, peer, "Map: device 1's access to device 0's mapping")

	mem, err := b.Create(0, gran)
	require.NoError(t, err)
	addr, err := b.Reserve(0, gran)
	require.NoError(t, err)
	defer func() { assert.NoError(t, b.Unreserve(0, addr, gran)) }()
	require.NoError(t, b.MapOwnDevice(0, addr, gran, mem))
	own, err = b.AccessOf(0, addr, 0)
	require.NoError(t, err)
	peer, err = b.AccessOf(0, addr, 1)
	require.NoError(t, err)
	assert.True(t, own, "MapOwnDevice: device 0's access")
	assert.False(t, peer, "MapOwnDevice: device 1 was granted access")
	require.NoError(t, b.Memset(0, 0, addr, 0x3c, gran), "device 0 writes its own-device mapping")
	requireAll(t, download(t, b, 0, addr, gran), 0x3c, "device 0's write")

	// The same memory mapped again with Map: the peer is granted again.
	require.NoError(t, b.Unmap(0, addr, gran))
	require.NoError(t, b.Map(0, addr, gran, mem))
	peer, err = b.AccessOf(0, addr, 1)
	require.NoError(t, err)
	assert.True(t, peer, "Map after MapOwnDevice: device 1's access")
	require.NoError(t, b.Unmap(0, addr, gran))
	require.NoError(t, b.Release(mem))

	_, err = b.AccessOf(0, addr, 1)
	assert.Error(t, err, "access of an address that is no longer mapped")
}

// newStream makes a stream on dev, destroyed when the test ends.
func newStream(t *testing.T, b *Backend, dev int) core.Stream {
	t.Helper()
	s, err := b.NewStream(dev)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, b.DestroyStream(dev, s)) })
	return s
}

// zeroedSegment is a one-granule segment on device 0 whose first 4 KiB are
// zero.
func zeroedSegment(t *testing.T, b *Backend) *segment {
	t.Helper()
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	s := newSegment(t, b, 0, gran)
	require.NoError(t, b.Memset(0, 0, s.addr, 0, 4096))
	return s
}

// TestBackendStreamMemOpsBatch: one batch waits for a flag, then writes, in
// array order; a batch longer than one driver call still runs in order.
func TestBackendStreamMemOpsBatch(t *testing.T) {
	b := requireGPU(t)
	s := zeroedSegment(t, b)
	flag, data := s.addr, s.addr+64
	sA, sB := newStream(t, b, 0), newStream(t, b, 0)

	// 300 operations (two driver calls): wait flag==1, then count data up
	// 1..299 and hand the flag back to 0 at the end.
	ops := []core.MemOp{{Addr: flag, Value: 1, Wait: true}}
	for v := uint32(1); v < 299; v++ {
		ops = append(ops, core.MemOp{Addr: data, Value: v})
	}
	ops = append(ops, core.MemOp{Addr: flag, Value: 0})
	require.Len(t, ops, 300)
	require.NoError(t, b.StreamMemOps(0, sA, ops, time.Second))
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, uint32(0), le32(download(t, b, 0, data, 4)), "the batch wrote before its wait was satisfied")
	require.NoError(t, b.StreamMemOps(0, sB, []core.MemOp{{Addr: flag, Value: 1}}, time.Second))
	within(t, 30*time.Second, "Synchronize(A)", func() error { return b.Synchronize(0, sA) })
	got := download(t, b, 0, s.addr, 128)
	assert.Equal(t, uint32(0), le32(got[0:]), "flag handed back by the last operation")
	assert.Equal(t, uint32(298), le32(got[64:]), "data holds the last value written in order")
}

// TestBackendStreamMemOpsAtLeast: an AtLeast wait (CU_STREAM_WAIT_VALUE_GEQ)
// holds the stream while the count is below its value, lets it go when the
// count reaches or passes it, and compares across wrap-around (0xFFFFFFFE
// then 2: 2 has passed 0xFFFFFFFF).
func TestBackendStreamMemOpsAtLeast(t *testing.T) {
	b := requireGPU(t)
	s := zeroedSegment(t, b)
	count, data := s.addr, s.addr+64
	sA, sB := newStream(t, b, 0), newStream(t, b, 0)
	write := func(v uint32) {
		require.NoError(t, b.StreamMemOps(0, sB, []core.MemOp{{Addr: count, Value: v}}, time.Second))
		require.NoError(t, b.Synchronize(0, sB))
	}
	step := func(wait, mark uint32) {
		require.NoError(t, b.StreamMemOps(0, sA, []core.MemOp{{Addr: count, Value: wait, Wait: true, AtLeast: true}, {Addr: data, Value: mark}}, time.Second))
	}
	data32 := func() uint32 { return le32(download(t, b, 0, data, 4)) }

	write(2)
	step(3, 1)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, uint32(0), data32(), "a wait for 3 passed at 2")
	write(5) // passes 3 at once: a count may run ahead of its waits
	within(t, 30*time.Second, "Synchronize(A)", func() error { return b.Synchronize(0, sA) })
	assert.Equal(t, uint32(1), data32())

	write(0xFFFFFFFE)
	step(0xFFFFFFFF, 2)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, uint32(1), data32(), "a wait for 0xFFFFFFFF passed at 0xFFFFFFFE")
	write(2)
	within(t, 30*time.Second, "Synchronize(A)", func() error { return b.Synchronize(0, sA) })
	assert.Equal(t, uint32(2), data32(), "2 has passed 0xFFFFFFFF (wrap-around)")
}

// TestBackendOnlyImportsAreMarkedImported: memory made here grants access
// to the peers that can reach it; only a peer's imported memory is mapped
// for the mapping device alone.
func TestBackendOnlyImportsAreMarkedImported(t *testing.T) {
	b := requireGPU(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	s := newSegment(t, b, 0, gran)
	_, imported := b.imported.Load(s.mem)
	require.False(t, imported, "created memory is marked imported")
	fd, err := b.Export(s.mem)
	require.NoError(t, err)
	m, err := b.Import(0, fd)
	require.NoError(t, err)
	_, imported = b.imported.Load(m)
	require.True(t, imported, "imported memory is not marked")
	require.NoError(t, b.Release(m))
	_, imported = b.imported.Load(m)
	require.False(t, imported, "a released handle stays marked")
}

// TestBackendStuckStreamTimesOut: a stream waiting for a value nobody
// writes (a peer that died) makes Synchronize and SynchronizeDevice fail with
// ErrTimeout after the backend's limit instead of hanging; once the value
// arrives, the device drains and synchronises again.
func TestBackendStuckStreamTimesOut(t *testing.T) {
	b := requireGPU(t)
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	s := newSegment(t, b, 0, gran)
	require.NoError(t, b.Memset(0, 0, s.addr, 0, 64))
	st, err := b.NewStream(0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, b.DestroyStream(0, st)) })
	saved := b.syncTimeout
	b.syncTimeout = 300 * time.Millisecond
	defer func() { b.syncTimeout = saved }()

	require.NoError(t, b.WaitValue32(0, st, s.addr, 1, time.Second))
	start := time.Now()
	err = b.Synchronize(0, st)
	require.Equal(t, core.ErrTimeout, core.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "stuck")
	err = b.SynchronizeDevice(0)
	require.Equal(t, core.ErrTimeout, core.CodeOf(err), "%v", err)
	require.Less(t, time.Since(start), 5*time.Second)

	// Repeated timeouts do not leave an OS thread each in the driver: the
	// abandoned calls are single-flight (Note [Bounded waits]).
	threads0 := osThreads(t)
	for i := 0; i < 6; i++ {
		err = b.SynchronizeDevice(0)
		require.Equal(t, core.ErrTimeout, core.CodeOf(err), "%v", err)
		require.Contains(t, err.Error(), "still waiting in the driver")
		require.Equal(t, core.ErrTimeout, core.CodeOf(b.Synchronize(0, st)))
	}
	require.LessOrEqual(t, osThreads(t), threads0+1, "OS threads after 12 more timeouts")

	other, err := b.NewStream(0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, b.DestroyStream(0, other)) })
	require.NoError(t, b.WriteValue32(0, other, s.addr, 1)) // the "peer" arrives
	b.syncTimeout = 30 * time.Second
	require.NoError(t, b.Synchronize(0, st))
	require.NoError(t, b.SynchronizeDevice(0))
}

// osThreads is the number of OS threads of this process.
func osThreads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Threads:") {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "Threads:")))
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no Threads: line in /proc/self/status")
	return 0
}

// The device's NVLink domain and, where it has one, a fabric handle's round
// trip: memory exported as a fabric handle, imported and mapped again shows
// the same bytes (Note [Fabric handles]).
func TestBackendFabricDomain(t *testing.T) {
	b := requireGPU(t)
	domain, why, err := b.FabricDomain(0)
	require.NoError(t, err)
	t.Logf("fabric domain of device 0: %q (%s)", domain, why)
	if domain == "" {
		require.NotEmpty(t, why, "no domain must say why")
		if isFake() && os.Getenv("FAKECUDA_FABRIC_OK") == "" {
			assert.Contains(t, why, "CUDA_ERROR_NOT_PERMITTED")
		}
		return
	}
	gran, err := b.Granularity(0)
	require.NoError(t, err)
	s1 := newSegment(t, b, 0, gran)
	h, err := b.ExportFabric(s1.mem)
	require.NoError(t, err)
	require.Len(t, h, FabricHandleSize)
	m2, err := b.ImportFabric(0, h)
	require.NoError(t, err)
	s2 := mapSegment(t, b, 0, gran, m2)
	require.NoError(t, b.Memset(0, 0, s1.addr, 0x3A, gran))
	requireAll(t, download(t, b, 0, s2.addr, gran), 0x3A, "written through the exporter's mapping, read through the fabric import")
	_, err = b.ImportFabric(0, h[:10])
	require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err))
	t.Logf("fabric handle round trip: ok")
}
