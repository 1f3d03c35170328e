package cuda

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// nvrtcOrSkip loads NVRTC; where it must be there (SYMMEM_REQUIRE_NVRTC=1,
// set by CI, which installs the nvidia-cuda-nvrtc-cu12 wheel, or
// SYMMEM_REQUIRE_GPU=1) its absence fails the test.
func nvrtcOrSkip(t *testing.T) *NVRTC {
	t.Helper()
	nv, err := LoadNVRTC()
	if err != nil {
		if os.Getenv("SYMMEM_REQUIRE_NVRTC") == "1" || os.Getenv("SYMMEM_REQUIRE_GPU") == "1" {
			t.Fatalf("NVRTC is required here: %v", err)
		}
		t.Skipf("no NVRTC on this machine (set SYMMEM_LIBNVRTC or install nvidia-cuda-nvrtc-cu12): %v", err)
	}
	return nv
}

// A user's kernel on the device header compiles with NVRTC (no GPU needed;
// the library's own kernels: TestBuildImages).
func TestDeviceHeaderCompiles(t *testing.T) {
	nv := nvrtcOrSkip(t)
	// A user kernel that includes only the device header compiles too,
	// and uses every part of it.
	src := `#include "symmem_device.cuh"
extern "C" __global__ void user(symmem_device_view v, int u, char *dst) {
  if (!symmem_dev_barrier_block(v, u)) return;
  symmem_dev_get_block(v, (v.rank + 1) % v.world, 0, dst, 1000);
  symmem_dev_put_block(v, (v.rank + 1) % v.world, 4096, dst, 1000);
  if (!symmem_dev_barrier_grid(v, u + 1)) return;
  if (threadIdx.x == 0) { symmem_dev_signal(v, 0, 300); symmem_dev_wait(v, 0, 300); }
  if (threadIdx.x == 1 && !symmem_dev_aborted(v, 300)) { *symmem_dev_arg_slot(v, 0, 0, 1) = 0; symmem_dev_fail_cause(v, SYMMEM_DEV_CAUSE_MISMATCH, 0, 300); }
  dst[0] = (char)symmem_dev_float_to_bf16(symmem_dev_f16_to_float(symmem_dev_float_to_f16(1.5f)));
}`
	if _, log, err := nv.Compile("user.cu", src, []Header{{Name: "symmem_device.cuh", Source: deviceHeaderForTest()}}, compileOptions(90)); err != nil {
		t.Fatalf("a user kernel on the device header: %v\n%s", err, log)
	}
}

// The embedded kernels compile with the library's own NVRTC path for
// Hopper (sm_90) with no GPU needed: at once into an empty cache, each image
// a cubin with its kernel alone; read back from the cache the second time;
// a corrupt file rebuilt.
func TestBuildImages(t *testing.T) {
	nv := nvrtcOrSkip(t)
	dir := t.TempDir()
	// The first collective builds its kernel alone.
	t0 := time.Now()
	if _, info, err := kernelImage(nv, 90, dir, imagesKey(nv, 90), reduceKernel(core.BFloat16, core.OpSum)); err != nil || info.FromCache {
		t.Fatalf("one kernel: %v %+v", err, info)
	}
	t.Logf("first use of one kernel (bfloat16 sum): compile %v", time.Since(t0))
	first, info, err := buildImages(nv, 90, dir, allKernels())
	if err != nil || info.FromCache || info.CompileMs <= 0 || info.CachePath != dir || info.Arch != 90 {
		t.Fatalf("first use: %v %+v", err, info)
	}
	t.Logf("every kernel: compile %.0f ms (%d programs at once, one from the cache)", info.CompileMs, numKernels)
	for k, img := range first {
		if !bytes.HasPrefix(img, []byte("\x7fELF")) {
			t.Fatalf("%s: the image is not a cubin (ELF): % x", kernelName(k), img[:min(8, len(img))])
		}
		for j := range numKernels {
			if got := bytes.Contains(img, []byte(kernelName(j)+"\x00")); got != (j == k) {
				t.Errorf("the image of %s holds %s: %v", kernelName(k), kernelName(j), got)
			}
		}
	}
	again, info, err := buildImages(nv, 90, dir, allKernels())
	if err != nil || !info.FromCache || info.CompileMs != 0 {
		t.Fatalf("cached: %v %+v", err, info)
	}
	t.Logf("cached: read %.2f ms", info.LoadMs)
	for k := range first {
		if !bytes.Equal(first[k], again[k]) {
			t.Fatalf("kernel %d: the cached image differs", k)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.cubin"))
	if len(files) != numKernels {
		t.Fatalf("cache files: %v", files)
	}
	os.WriteFile(files[2], []byte("SYMMEMK1 garbage"), 0o600)
	if _, info, err = buildImages(nv, 90, dir, allKernels()); err != nil || info.FromCache || !strings.Contains(info.Note, "rebuilt") {
		t.Fatalf("corrupt file: %v %+v", err, info)
	}
}

// Every (dtype, op) has its kernel, named after both; the all-gather its own.
func TestKernelNames(t *testing.T) {
	seen := map[string]bool{}
	for dt := core.Float32; dt <= core.Int32; dt++ {
		for op := core.OpSum; op <= core.OpMin; op++ {
			k := reduceKernel(dt, op)
			want := "symmem_coll_" + dt.String() + "_" + op.String()
			if k < 0 || k >= numReduceKernels || kernelName(k) != want || seen[want] {
				t.Fatalf("%v %v: kernel %d %q", dt, op, k, kernelName(k))
			}
			seen[want] = true
		}
	}
	if kernelName(allGatherKernel) != "symmem_all_gather" || kernelDefines(allGatherKernel) != nil || len(seen) != numReduceKernels {
		t.Fatal("all-gather kernel")
	}
	if kernelName(memOpsKernel) != "symmem_memops" || len(kernelDefines(memOpsKernel)) != 1 {
		t.Fatal("stream signals' kernel")
	}
	if kernelName(allToAllKernel) != "symmem_all_to_all" || len(kernelDefines(allToAllKernel)) != 1 {
		t.Fatal("all-to-all kernel")
	}
	// The all-reduce with RMSNorm: one kernel per float dtype.
	for dt := core.Float32; dt <= core.BFloat16; dt++ {
		k := normKernels + int(dt)
		if want := "symmem_all_reduce_rmsnorm_" + dt.String(); k >= numKernels || kernelName(k) != want || seen[want] {
			t.Fatalf("%v: norm kernel %d %q", dt, k, kernelName(k))
		}
		seen[kernelName(k)] = true
	}
	// The copy-engine collectives' reduction: one kernel per (dtype, op).
	for dt := core.Float32; dt <= core.Int32; dt++ {
		for op := core.OpSum; op <= core.OpMin; op++ {
			k := ceReduceKernels + reduceKernel(dt, op)
			if want := "symmem_ce_reduce_" + dt.String() + "_" + op.String(); k >= numKernels || kernelName(k) != want || seen[want] || len(kernelDefines(k)) != 3 {
				t.Fatalf("%v %v: copy-engine reduction kernel %d %q", dt, op, k, kernelName(k))
			}
			seen[kernelName(k)] = true
		}
	}
	if normKernels+3 != ceReduceKernels || len(seen) != numKernels-3 {
		t.Fatal("kernels past the copy engines' reductions")
	}
}

// A compile error is reported with NVRTC's log.
func TestNVRTCCompileError(t *testing.T) {
	nv := nvrtcOrSkip(t)
	_, _, err := nv.Compile("bad.cu", "__global__ void k() { undeclared(); }", nil, compileOptions(90))
	if core.CodeOf(err) != core.ErrBackend || !strings.Contains(err.Error(), "undeclared") || !strings.Contains(err.Error(), "nvrtcCompileProgram") {
		t.Fatalf("got %v, want ErrBackend with the log", err)
	}
}

// Without NVRTC the error is UNAVAILABLE and says what to install.
func TestNVRTCMissing(t *testing.T) {
	nvrtcState.mu.Lock()
	saved := nvrtcState.nv
	nvrtcState.nv = nil
	nvrtcState.mu.Unlock()
	defer func() { nvrtcState.mu.Lock(); nvrtcState.nv = saved; nvrtcState.mu.Unlock() }()
	t.Setenv(EnvNVRTC, filepath.Join(t.TempDir(), "libnvrtc.so.12"))
	old := env
	env = os.Getenv
	defer func() { env = old }()
	_, err := LoadNVRTC()
	if core.CodeOf(err) != core.ErrUnavailable || !strings.Contains(err.Error(), "pip install nvidia-cuda-nvrtc") || !strings.Contains(err.Error(), EnvNVRTC) {
		t.Fatalf("got %v, want UNAVAILABLE naming what to install", err)
	}
}

// The cache: a miss compiles and writes, a hit reads; a corrupt or
// truncated file is rebuilt, never used; ranks compiling at once all get
// the image and leave no temporary file.
func TestKernelCache(t *testing.T) {
	dir := t.TempDir()
	image := bytes.Repeat([]byte("cubin!"), 1000)
	var compiles atomic.Int32
	compile := func() ([]byte, error) { compiles.Add(1); return append([]byte(nil), image...), nil }
	get := func(name string) core.KernelInfo {
		t.Helper()
		img, info, err := cachedImage(dir, name, compile)
		if err != nil || !bytes.Equal(img, image) {
			t.Fatalf("cachedImage: %v (image equal: %v)", err, bytes.Equal(img, image))
		}
		return info
	}
	if info := get("a.cubin"); info.FromCache || compiles.Load() != 1 || info.CachePath == "" {
		t.Fatalf("first use: %+v, compiles %d", info, compiles.Load())
	}
	if info := get("a.cubin"); !info.FromCache || compiles.Load() != 1 {
		t.Fatalf("second use: %+v, compiles %d", info, compiles.Load())
	}
	path := filepath.Join(dir, "a.cubin")
	data, _ := os.ReadFile(path)
	data[len(data)-3] ^= 0xff
	os.WriteFile(path, data, 0o600)
	if info := get("a.cubin"); info.FromCache || compiles.Load() != 2 || !strings.Contains(info.Note, "corrupt") {
		t.Fatalf("corrupt file: %+v, compiles %d", info, compiles.Load())
	}
	if info := get("a.cubin"); !info.FromCache {
		t.Fatalf("after the rebuild: %+v", info)
	}
	os.WriteFile(path, data[:20], 0o600)
	if info := get("a.cubin"); info.FromCache || !strings.Contains(info.Note, "not a libsymmem kernel image") {
		t.Fatalf("truncated file: %+v", info)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); get("b.cubin") }()
	}
	wg.Wait()
	left, _ := filepath.Glob(filepath.Join(dir, "*.tmp*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	// A folder that cannot be written: compiled, not cached, said why.
	ro := filepath.Join(t.TempDir(), "ro")
	os.Mkdir(ro, 0o500)
	if os.Getuid() != 0 {
		_, info, err := cachedImage(filepath.Join(ro, "sub"), "c.cubin", compile)
		if err != nil || info.CachePath != "" || !strings.Contains(info.Note, "cannot write") {
			t.Fatalf("read-only cache: %v %+v", err, info)
		}
	}
}

// The launch geometry is a function of the arguments alone (every rank
// must pick the same grid: the barriers pair blocks).
func TestCollGrid(t *testing.T) {
	c := &core.Collective{Kind: core.AllReduce, DType: core.BFloat16, Algo: core.AlgoOneShot, World: 2, Count: 1}
	if g, th := collGrid(c); g != 1 || th != 32 {
		t.Fatalf("1 element: %d blocks of %d threads", g, th)
	}
	c.Count = 2048 // 4 KiB: 256 vectors, one block of 256 threads
	if g, th := collGrid(c); g != 1 || th != 256 {
		t.Fatalf("4 KiB: %d blocks of %d threads", g, th)
	}
	c.World, c.Count = 40, 1 // the barrier needs a thread per rank
	if g, th := collGrid(c); g != 1 || th != 64 {
		t.Fatalf("40 ranks: %d blocks of %d threads", g, th)
	}
	c.World, c.Count = 2, 256<<20
	if g, th := collGrid(c); g != collMaxBlocks || th != collThreads {
		t.Fatalf("512 MiB: %d blocks of %d threads", g, th)
	}
	c.Count, c.Algo = 512*8*3, core.AlgoTwoShot // 3 vectors' worth of threads, halved
	if g, th := collGrid(c); g != 2 || th != collThreads {
		t.Fatalf("two-shot: %d blocks of %d threads", g, th)
	}
	p := packCollParams(&core.Collective{Kind: core.AllGather, DType: core.Int32, Count: 5, Rank: 1, World: 2, Channel: 3, OutOffset: -1})
	if p[32] != 1 || p[36] != 2 || p[64] != 20 || p[84] != 3*collMaxBlocks || p[56] != 0xff || p[92] != 0 {
		t.Fatalf("params % x", p)
	}
	// The all-gather of the hierarchical all-reduce: rank q's input at
	// in_offset + q*count (Note [Team view]).
	if p := packCollParams(&core.Collective{Kind: core.AllGather, DType: core.Int32, Count: 5, SlicedInput: true}); p[92] != 1 {
		t.Fatalf("sliced all-gather params % x", p)
	}
	// The low-latency path: algo 4, its buffers' offset and slot, and the
	// unchecked flag at 112 (Note [Low-latency collectives]).
	ll := &core.Collective{Kind: core.AllReduce, DType: core.BFloat16, Algo: core.AlgoLowLatency, World: 2, Count: 2048,
		LLOffset: 0x12300, LLSlot: 0x80000, Unchecked: true}
	p = packCollParams(ll)
	if p[76] != 4 || binary.LittleEndian.Uint64(p[96:]) != 0x12300 || binary.LittleEndian.Uint64(p[104:]) != 0x80000 || p[112] != 1 {
		t.Fatalf("low-latency params % x", p)
	}
	// One thread per 16-byte line: 4 KiB of bf16 is 512 lines, one block.
	if g, th := collGrid(ll); g != 1 || th != collThreads {
		t.Fatalf("low-latency 4 KiB: %d blocks of %d threads", g, th)
	}
	ll.Kind, ll.World, ll.Count = core.ReduceScatter, 4, 64<<10 // 128 KiB in, 32 KiB per peer: 4096 lines
	if g, th := collGrid(ll); g != 8 || th != collThreads {
		t.Fatalf("low-latency reduce-scatter: %d blocks of %d threads", g, th)
	}
	// The two-shot pull is the kernels' algo 3, not the C API's 3 (hierarchical).
	if p := packCollParams(&core.Collective{Kind: core.AllReduce, Algo: core.AlgoTwoShot, Pull: true}); p[76] != core.KernelTwoShotPull {
		t.Fatalf("two-shot pull params % x", p)
	}
	// The stop word's pinned mirror at 184 (Note [Failed collectives]).
	if p := packCollParams(&core.Collective{Kind: core.AllReduce, StopMirror: 0x7f0012345678}); binary.LittleEndian.Uint64(p[184:]) != 0x7f0012345678 {
		t.Fatalf("stop mirror params % x", p)
	}
}
