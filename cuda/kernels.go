package cuda

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/include"
)

// Note [Kernels compiled at run time]
//
// The collectives' CUDA source (kernels/collectives.cu, on top of
// include/symmem_device.cuh) is embedded in the library. It holds thirty
// kernels, each built as its own NVRTC program: all-reduce/reduce-scatter
// for each dtype and op (the op a template argument, so that no kernel
// carries the other two ops in its unrolled loops), the all-gather, the
// all-to-all, the stream signals' kernel (Note [Signals as a kernel] in
// core/symm), the all-reduce with RMSNorm for each float dtype and the
// copy-engine collectives' local reduction for each dtype and op. A
// kernel is built at its first use on a device, so the first collective
// waits for one program (a few hundred ms) rather than for all of them;
// symmem_collectives_load builds every missing one at once, in parallel.
// For kernel k the backend:
//
//  1. loads NVRTC (LoadNVRTC) and reads the device's compute capability
//     (once per device: kernelModule);
//  2. computes the key: SHA-256 of the source, the header, the options and
//     NVRTC's version; the cache file is
//     <cache>/kernels/collectives-<key>-<kernel name>-sm_<arch>.cubin, where
//     <cache> is $SYMMEM_CACHE_DIR or the user's cache directory
//     (os.UserCacheDir: $XDG_CACHE_HOME or ~/.cache) + /libsymmem;
//  3. reads the file and trusts it only if it starts with cacheMagic and
//     the SHA-256 that follows matches the rest; otherwise compiles with
//     NVRTC to a cubin for sm_<arch> and writes the file: a temporary file
//     in the same folder, renamed over the name, so ranks that compile at
//     once each write a whole file and readers never see a partial one (a
//     corrupt or truncated file is rebuilt and replaced, never loaded);
//  4. loads the image with cuModuleLoadData and looks its kernel up.
//
// A cache that cannot be written (read-only home) only costs a compile per
// process: the reason goes in KernelInfo.Note. Modules stay loaded for the
// life of the process.

//go:embed kernels/collectives.cu
var collectivesSource string

// cacheMagic starts every cache file (then 32 bytes of SHA-256, then the image).
const cacheMagic = "SYMMEMK1"

// numReduceKernels are the all-reduce/reduce-scatter kernels, one per
// (dtype, op); kernel numReduceKernels is the all-gather, the next one the
// stream signals' kernel (Note [Signals as a kernel] in core/symm).
const (
	numReduceKernels = 4 * 3
	allGatherKernel  = numReduceKernels
	memOpsKernel     = numReduceKernels + 1
	allToAllKernel   = numReduceKernels + 2
	// normKernels: the all-reduce with RMSNorm, one per float dtype
	// (normKernels + core.DType).
	normKernels = numReduceKernels + 3
	// ceReduceKernels: the copy-engine collectives' local reduction, one
	// per (dtype, op) as the reduce kernels (ceReduceKernels +
	// reduceKernel(dt, op); cuda/copyengine.go).
	ceReduceKernels = numReduceKernels + 6
	numKernels      = ceReduceKernels + numReduceKernels
)

// reduceKernel is the index of the kernel for dt and op.
func reduceKernel(dt core.DType, op core.ReduceOp) int { return int(dt)*3 + int(op) }

// kernelName is kernel k's name in its program: symmem_coll_<dtype>_<op>,
// or symmem_all_gather.
func kernelName(k int) string {
	switch k {
	case allGatherKernel:
		return "symmem_all_gather"
	case memOpsKernel:
		return "symmem_memops"
	case allToAllKernel:
		return "symmem_all_to_all"
	}
	if k >= ceReduceKernels {
		j := k - ceReduceKernels
		return fmt.Sprintf("symmem_ce_reduce_%s_%s", core.DType(j/3), core.ReduceOp(j%3))
	}
	if k >= normKernels {
		return fmt.Sprintf("symmem_all_reduce_rmsnorm_%s", core.DType(k-normKernels))
	}
	return fmt.Sprintf("symmem_coll_%s_%s", core.DType(k/3), core.ReduceOp(k%3))
}

// allKernels is every kernel's index.
func allKernels() []int {
	ks := make([]int, numKernels)
	for k := range ks {
		ks[k] = k
	}
	return ks
}

// kernelDefines are the macros that make the source build kernel k alone.
func kernelDefines(k int) []string {
	switch k {
	case allGatherKernel:
		return nil
	case memOpsKernel:
		return []string{"-DSYMMEM_MEMOPS=1"}
	case allToAllKernel:
		return []string{"-DSYMMEM_A2A=1"}
	}
	if k >= ceReduceKernels {
		j := k - ceReduceKernels
		return []string{fmt.Sprintf("-DSYMMEM_CE_DT=%d", j/3), fmt.Sprintf("-DSYMMEM_CE_OP=%d", j%3), "-DSYMMEM_CE_NAME=" + kernelName(k)}
	}
	if k >= normKernels {
		return []string{fmt.Sprintf("-DSYMMEM_NORM_DT=%d", k-normKernels), "-DSYMMEM_NORM_NAME=" + kernelName(k)}
	}
	return []string{fmt.Sprintf("-DSYMMEM_COLL_DT=%d", k/3), fmt.Sprintf("-DSYMMEM_COLL_OP=%d", k%3),
		"-DSYMMEM_COLL_NAME=" + kernelName(k)}
}

const (
	collThreads   = 512 // SYMMEM_COLL_THREADS of the source
	collMaxBlocks = 64  // SYMMEM_DEV_COLL_MAX_BLOCKS
	collParamSize = 192 // sizeof(symmem_coll_params), checked by static_assert there
	llDirectRanks = 8   // SYMMEM_LL_DIRECT_RANKS: ll_base entries
)

// kernelModule is one device's collectives: what building a kernel needs
// (step 1 of Note [Kernels compiled at run time]) and each kernel once
// loaded. A kernel is built under its own lock, so that two threads' first
// uses of different kernels compile at once.
type kernelModule struct {
	dev     int
	ctx     C.uintptr_t
	arch    int
	sms     int
	nv      *NVRTC
	dir     string // "" : no cache (why: dirWhy)
	dirWhy  string
	key     string
	kernels [numKernels]loadedKernel
	// memOpsWhy holds, once the stream signals' kernel failed to build or
	// load, the ErrUnavailable that LaunchMemOps returns from then on.
	memOpsWhy atomic.Value
}

// loadedKernel is one kernel's function once loaded (its module stays
// loaded for the life of the process).
type loadedKernel struct {
	mu sync.Mutex
	fn C.uintptr_t // 0 until loaded
}

// compileOptions are NVRTC's options for arch (major*10+minor).
func compileOptions(arch int) []string {
	return []string{fmt.Sprintf("--gpu-architecture=sm_%d", arch), "--std=c++17", "-DSYMMEM_NVRTC=1"}
}

// CompileKernel compiles kernel k of the embedded collectives alone for
// arch with nv: step 3 without the cache.
func CompileKernel(nv *NVRTC, arch, k int) ([]byte, error) {
	img, _, err := nv.Compile("collectives.cu", collectivesSource,
		[]Header{{Name: "symmem_device.cuh", Source: include.DeviceHeader}},
		append(compileOptions(arch), kernelDefines(k)...))
	return img, err
}

// imagesKey is step 2's key for arch and nv.
func imagesKey(nv *NVRTC, arch int) string {
	return cacheKey(collectivesSource, include.DeviceHeader, strings.Join(compileOptions(arch), " "),
		fmt.Sprintf("nvrtc %d.%d", nv.Major, nv.Minor))
}

// cacheDir is where images are cached, or "" with the reason.
func cacheDir() (string, string) {
	if d := core.Current().Text("SYMMEM_CACHE_DIR", ""); d != "" {
		return filepath.Join(d, "kernels"), ""
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Sprintf("no cache directory (%v); set SYMMEM_CACHE_DIR", err)
	}
	return filepath.Join(d, "libsymmem", "kernels"), ""
}

// cacheKey names the image of these inputs.
func cacheKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:", len(p))
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// readCached returns the image in path, or nil with why it is not usable.
func readCached(path string) ([]byte, string) {
	data, err := os.ReadFile(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, ""
		}
		return nil, fmt.Sprintf("cache file %s unreadable (%v): rebuilt", path, err)
	}
	if len(data) < len(cacheMagic)+sha256.Size || string(data[:len(cacheMagic)]) != cacheMagic {
		return nil, fmt.Sprintf("cache file %s is not a libsymmem kernel image: rebuilt", path)
	}
	sum := sha256.Sum256(data[len(cacheMagic)+sha256.Size:])
	if !bytes.Equal(sum[:], data[len(cacheMagic):len(cacheMagic)+sha256.Size]) {
		return nil, fmt.Sprintf("cache file %s is corrupt (checksum mismatch): rebuilt", path)
	}
	return data[len(cacheMagic)+sha256.Size:], ""
}

// writeCached writes image to path through a temporary file and a rename.
func writeCached(path string, image []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	sum := sha256.Sum256(image)
	_, err = f.Write(append(append([]byte(cacheMagic), sum[:]...), image...))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// cachedImage is steps 2 and 3: the image for key from the cache in dir,
// or built by compile and stored there.
func cachedImage(dir, name string, compile func() ([]byte, error)) (img []byte, info core.KernelInfo, err error) {
	var notes []string
	path := ""
	if dir != "" {
		path = filepath.Join(dir, name)
		t0 := time.Now()
		var why string
		if img, why = readCached(path); img != nil {
			info.FromCache, info.CachePath = true, path
			info.LoadMs = ms(time.Since(t0))
			return img, info, nil
		} else if why != "" {
			notes = append(notes, why)
		}
	}
	t0 := time.Now()
	if img, err = compile(); err != nil {
		return nil, info, err
	}
	info.CompileMs = ms(time.Since(t0))
	if path != "" {
		if werr := writeCached(path, img); werr != nil {
			notes = append(notes, fmt.Sprintf("cannot write the cache file %s: %v", path, werr))
		} else {
			info.CachePath = path
		}
	}
	info.Note = strings.Join(notes, "; ")
	return img, info, nil
}

// kernelImage is steps 2 and 3 for kernel k: its image for arch from the
// cache in dir ("": no cache) under key, compiled where missing or corrupt.
func kernelImage(nv *NVRTC, arch int, dir, key string, k int) ([]byte, core.KernelInfo, error) {
	img, info, err := cachedImage(dir, fmt.Sprintf("collectives-%s-%s-sm_%d.cubin", key, kernelName(k), arch),
		func() ([]byte, error) { return CompileKernel(nv, arch, k) })
	if err != nil {
		return nil, info, core.Errorf(core.CodeOf(err), "building the collectives' kernel %s: %v", kernelName(k), err)
	}
	return img, info, nil
}

// buildImages is steps 2 and 3 for kernels ks at once (buildAtOnce).
func buildImages(nv *NVRTC, arch int, dir string, ks []int) ([][]byte, core.KernelInfo, error) {
	key := imagesKey(nv, arch)
	imgs := make([][]byte, len(ks))
	info, err := buildAtOnce(nv, arch, dir, ks, func(i, k int) (info core.KernelInfo, err error) {
		imgs[i], info, err = kernelImage(nv, arch, dir, key, k)
		return info, err
	})
	return imgs, info, err
}

// buildAtOnce runs build(i, ks[i]) for every kernel of ks on a goroutine of
// its own (NVRTC is thread-safe: the wall time is about the longest compile
// rather than their sum) and sums up what they did: from the cache only if
// all were, the wall time as CompileMs or LoadMs, the notes once each; the
// first error if any.
func buildAtOnce(nv *NVRTC, arch int, dir string, ks []int, build func(i, k int) (core.KernelInfo, error)) (core.KernelInfo, error) {
	infos := make([]core.KernelInfo, len(ks))
	errs := make([]error, len(ks))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, k := range ks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i], errs[i] = build(i, k)
		}()
	}
	wg.Wait()
	wall := ms(time.Since(t0))
	info := core.KernelInfo{Arch: arch, Compiler: nv.String(), FromCache: true, CachePath: dir}
	var notes []string
	for i := range infos {
		if errs[i] != nil {
			return info, errs[i]
		}
		info.FromCache = info.FromCache && infos[i].FromCache
		if infos[i].Note != "" && !slices.Contains(notes, infos[i].Note) {
			notes = append(notes, infos[i].Note)
		}
		if infos[i].CachePath == "" {
			info.CachePath = "" // not (all) cached
		}
	}
	if info.FromCache {
		info.LoadMs = wall
	} else {
		info.CompileMs = wall
	}
	info.Note = strings.Join(notes, "; ")
	return info, nil
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// kernels returns device dev's kernelModule (step 1), made at first use;
// its kernels are built by kernel or LoadKernels.
func (b *Backend) kernels(dev int) (*kernelModule, error) {
	d, err := b.device(dev)
	if err != nil {
		return nil, err
	}
	d.kernMu.Lock()
	defer d.kernMu.Unlock()
	if d.kern != nil {
		return d.kern, nil
	}
	major, err := d.attribute(C.SM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
	if err != nil {
		return nil, err
	}
	minor, err := d.attribute(C.SM_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
	if err != nil {
		return nil, err
	}
	sms, err := d.attribute(C.SM_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
	if err != nil {
		return nil, err
	}
	nv, err := LoadNVRTC()
	if err != nil {
		return nil, err
	}
	m := &kernelModule{dev: dev, ctx: d.ctx, arch: major*10 + minor, sms: sms, nv: nv}
	m.dir, m.dirWhy = cacheDir()
	m.key = imagesKey(nv, m.arch)
	d.kern = m
	return m, nil
}

// kernel returns kernel k's function, building and loading it at first use
// (steps 2 to 4), with how that went (zero if it was loaded already).
func (m *kernelModule) kernel(k int) (C.uintptr_t, core.KernelInfo, error) {
	lk := &m.kernels[k]
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.fn != 0 {
		return lk.fn, core.KernelInfo{Arch: m.arch, Compiler: m.nv.String(), FromCache: true, CachePath: m.dir}, nil
	}
	img, info, err := kernelImage(m.nv, m.arch, m.dir, m.key, k)
	if err != nil {
		return 0, info, core.Errorf(core.CodeOf(err), "cuda: device %d: %v", m.dev, err)
	}
	t0 := time.Now()
	var module, fn C.uintptr_t
	err = check(C.smcu_module_load(m.ctx, unsafe.Pointer(&img[0]), &module), m.dev)
	if err == nil {
		cn := C.CString(kernelName(k))
		err = check(C.smcu_module_function(m.ctx, module, cn, &fn), m.dev)
		C.free(unsafe.Pointer(cn))
		if err != nil {
			C.smcu_module_unload(m.ctx, module)
		}
	}
	if err != nil {
		return 0, info, core.Errorf(core.CodeOf(err), "%v (kernel %s for sm_%d from %s)", err, kernelName(k), m.arch, m.nv)
	}
	info.LoadMs += ms(time.Since(t0))
	info.Arch, info.Compiler = m.arch, m.nv.String()
	lk.fn = fn
	return fn, info, nil
}

// LoadKernels is core.KernelLoader: every collectives kernel of device,
// compiled or read from the cache where not loaded yet, at once, and loaded.
func (b *Backend) LoadKernels(dev int) (core.KernelInfo, error) {
	m, err := b.kernels(dev)
	if err != nil {
		return core.KernelInfo{}, err
	}
	info, err := buildAtOnce(m.nv, m.arch, m.dir, allKernels(), func(_, k int) (core.KernelInfo, error) {
		_, info, err := m.kernel(k)
		return info, err
	})
	if err == nil && m.dirWhy != "" {
		info.Note = strings.TrimPrefix(info.Note+"; "+m.dirWhy, "; ")
	}
	return info, err
}

// collBlocks is the most blocks a collective runs on: collMaxBlocks (the
// pad sets one channel owns), or fewer with SYMMEM_COLL_MAX_BLOCKS (for
// tuning; every rank of a group must use the same value, as with any
// setting that changes the launch geometry).
var collBlocks = func() uint64 {
	n, err := strconv.Atoi(core.Current().Text("SYMMEM_COLL_MAX_BLOCKS", ""))
	if err != nil || n <= 0 || n > collMaxBlocks {
		return collMaxBlocks
	}
	return uint64(n)
}()

// collGrid is the launch geometry for c: blocks enough for one 16-byte item
// per thread, at most collBlocks; threads per block collThreads, or for a
// single block only as many warps as its items (and the barrier's one thread
// per rank) need: a tiny collective's __syncthreads and launch wait on fewer
// warps. Every rank computes the same geometry from the same arguments,
// which the block-paired barriers need.
func collGrid(c *core.Collective) (blocks, threads uint32) {
	bytes := uint64(c.Count) * uint64(c.DType.Size())
	w := uint64(c.World)
	var work uint64
	switch {
	case c.Algo == core.AlgoLowLatency:
		// One thread per 8 bytes sent to each peer (a 16-byte line).
		work = bytes * 2
		if c.Kind == core.ReduceScatter {
			work /= w
		}
	case c.Kind == core.AllGather || c.Kind == core.AllToAll:
		work = bytes * w
	case c.Kind == core.ReduceScatter || c.Algo == core.AlgoTwoShot:
		work = bytes / w
	default:
		work = bytes
	}
	items := (work + 15) / 16
	g := (items + collThreads - 1) / collThreads
	if g > 1 {
		return uint32(min(g, collBlocks)), collThreads
	}
	t := (max(items, w, 1) + 31) / 32 * 32
	return 1, uint32(min(t, collThreads))
}

// packViewInOut lays out what every kernel's parameters start with
// (kernels/collectives.cu): symmem_device_view at 0, the input's offset in
// every block at 40, this rank's out at 48.
func packViewInOut(p []byte, c *core.Collective) {
	le := binary.LittleEndian
	le.PutUint64(p[0:], uint64(c.Buffers))
	le.PutUint64(p[8:], uint64(c.Pads))
	le.PutUint64(p[16:], uint64(c.PadSize))
	le.PutUint64(p[24:], c.TimeoutNs)
	le.PutUint32(p[32:], uint32(c.Rank))
	le.PutUint32(p[36:], uint32(c.World))
	le.PutUint64(p[40:], uint64(c.InOffset))
	le.PutUint64(p[48:], uint64(c.Out))
}

// packCollParams lays c out as symmem_coll_params (kernels/collectives.cu).
func packCollParams(c *core.Collective) [collParamSize]byte {
	var p [collParamSize]byte
	le := binary.LittleEndian
	packViewInOut(p[:], c)
	le.PutUint64(p[56:], uint64(c.OutOffset))
	count := uint64(c.Count)
	if c.Kind == core.AllGather || c.Kind == core.AllToAll {
		count *= uint64(c.DType.Size())
	}
	le.PutUint64(p[64:], count)
	le.PutUint32(p[72:], uint32(c.Kind))
	le.PutUint32(p[76:], c.KernelAlgo())
	le.PutUint32(p[80:], uint32(c.Op))
	le.PutUint32(p[84:], uint32(c.Channel*collMaxBlocks))
	le.PutUint32(p[88:], c.Digest)
	if c.SlicedInput {
		le.PutUint32(p[92:], 1)
	}
	le.PutUint64(p[96:], uint64(c.LLOffset))
	le.PutUint64(p[104:], uint64(c.LLSlot))
	if c.Unchecked {
		le.PutUint32(p[112:], 1) // SYMMEM_COLL_UNCHECKED
	}
	if c.Algo == core.AlgoLowLatency && c.World <= llDirectRanks && len(c.PadAddrs) >= c.World {
		for r := 0; r < c.World; r++ {
			le.PutUint64(p[120+8*r:], uint64(c.PadAddrs[r]+c.LLOffset))
		}
	}
	le.PutUint64(p[184:], uint64(c.StopMirror))
	return p
}

// collPDL says whether collectives launch with programmatic dependent
// launch (SYMMEM_COLL_PDL, on; used from sm_90, where the kernels' wait
// for the previous kernel exists).
var collPDL = core.Current().Bool("SYMMEM_COLL_PDL", true)

// LaunchCollective is core.CollectiveLauncher: c as one kernel on stream s.
func (b *Backend) LaunchCollective(dev int, s core.Stream, c *core.Collective) error {
	if c.World > collThreads {
		return core.Errorf(core.ErrUnavailable, "cuda: collectives support at most %d ranks (the group has %d)", collThreads, c.World)
	}
	m, err := b.kernels(dev)
	if err != nil {
		return err
	}
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	if c.Norm != nil {
		return b.launchNorm(m, d, dev, s, c)
	}
	if c.Kind == core.AllToAll && (c.V != nil || c.Algo != core.AlgoLowLatency) {
		return b.launchAllToAll(m, d, dev, s, c)
	}
	k := allGatherKernel // also the all-to-all's low-latency calls
	if c.Kind != core.AllGather && c.Kind != core.AllToAll {
		k = reduceKernel(c.DType, c.Op)
	}
	fn, _, err := m.kernel(k)
	if err != nil {
		return err
	}
	params := packCollParams(c)
	blocks, threads := collGrid(c)
	pdl := C.int(0)
	if collPDL && m.arch >= 90 {
		pdl = 1
	}
	return check(C.smcu_launch(d.ctx, fn, C.uint(blocks), C.uint(threads), C.uintptr_t(s), unsafe.Pointer(&params[0]), pdl), dev)
}

// memOpsMax is SYMMEM_MEMOPS_MAX, and memOpsParamSize
// sizeof(symmem_memops_params) (kernels/collectives.cu).
const (
	memOpsMax       = 16
	memOpsParamSize = 288
)

// LaunchMemOps is core.KernelMemOps: ops as one kernel of memOpsMax threads
// at most, launched like the collectives (programmatic dependent launch
// from sm_90). UNAVAILABLE when the kernel cannot be had (no NVRTC) or ops
// do not fit: the caller then uses StreamMemOps.
func (b *Backend) LaunchMemOps(dev int, s core.Stream, ops []core.MemOp, w core.MemOpWatch) error {
	if len(ops) == 0 {
		return nil
	}
	if len(ops) > memOpsMax || len(w.Peers) != len(ops) {
		return core.Errorf(core.ErrUnavailable, "cuda: %d stream signals in one launch (at most %d)", len(ops), memOpsMax)
	}
	m, err := b.kernels(dev)
	if err != nil {
		return core.Errorf(core.ErrUnavailable, "cuda: device %d: no kernels for the stream signals: %v", dev, err)
	}
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	if why := m.memOpsWhy.Load(); why != nil {
		return why.(error)
	}
	fn, _, err := m.kernel(memOpsKernel)
	if err != nil {
		// Remembered: the caller falls back to StreamMemOps for the life of
		// the process rather than retrying a compile at every signal.
		err = core.Errorf(core.ErrUnavailable, "cuda: device %d: the stream signals' kernel is unavailable: %v", dev, err)
		m.memOpsWhy.Store(err)
		return err
	}
	var p [memOpsParamSize]byte
	le := binary.LittleEndian
	for i, op := range ops {
		kind := uint32(w.Peers[i]&0x1fff) << 8
		if op.Wait {
			kind |= 1
			if op.AtLeast {
				kind |= 2
			}
		}
		le.PutUint64(p[8*i:], uint64(op.Addr))
		le.PutUint32(p[128+4*i:], op.Value)
		le.PutUint32(p[192+4*i:], kind)
	}
	le.PutUint64(p[256:], uint64(w.Flag))
	le.PutUint64(p[264:], uint64(w.Abort))
	le.PutUint64(p[272:], w.TimeoutNs)
	le.PutUint32(p[280:], uint32(len(ops)))
	threads := (len(ops) + 31) / 32 * 32
	pdl := C.int(0)
	if collPDL && m.arch >= 90 {
		pdl = 1
	}
	return check(C.smcu_launch(d.ctx, fn, 1, C.uint(threads), C.uintptr_t(s), unsafe.Pointer(&p[0]), pdl), dev)
}
