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
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/include"
)

// Note [Kernels compiled at run time]
//
// The collectives' CUDA source (kernels/collectives.cu, on top of
// include/symmem_device.cuh) is embedded in the library. At the first
// collective on a device (or symmem_collectives_load) the backend:
//
//  1. loads NVRTC (LoadNVRTC) and reads the device's compute capability;
//  2. computes the key: SHA-256 of the source, the header, the options and
//     NVRTC's version; kernel k's cache file is
//     <cache>/kernels/collectives-<key>-<k>-sm_<arch>.cubin, where <cache> is
//     $SYMMEM_CACHE_DIR or the user's cache directory (os.UserCacheDir:
//     $XDG_CACHE_HOME or ~/.cache) + /libsymmem;
//  3. reads the file and trusts it only if it starts with cacheMagic and
//     the SHA-256 that follows matches the rest; otherwise compiles with
//     NVRTC to a cubin for sm_<arch> and writes the file: a temporary file
//     in the same folder, renamed over the name, so ranks that compile at
//     once each write a whole file and readers never see a partial one (a
//     corrupt or truncated file is rebuilt and replaced, never loaded);
//     The five kernels (one per dtype for all-reduce and reduce-scatter,
//     all-gather) are five programs (SYMMEM_COLL_ONLY=k) compiled at once
//     on five threads, so the first use waits for the longest of them;
//  4. loads each image with cuModuleLoadData and looks its kernel up.
//
// A cache that cannot be written (read-only home) only costs a compile per
// process: the reason goes in KernelInfo.Note. The module stays loaded for
// the life of the process.

//go:embed kernels/collectives.cu
var collectivesSource string

// cacheMagic starts every cache file (then 32 bytes of SHA-256, then the image).
const cacheMagic = "SYMMEMK1"

// kernelNames are the module's kernels: one per dtype (core.DType order)
// for all-reduce and reduce-scatter, then all-gather.
var kernelNames = [...]string{"symmem_coll_float32", "symmem_coll_float16", "symmem_coll_bfloat16", "symmem_coll_int32", "symmem_all_gather"}

const (
	collThreads   = 512 // SYMMEM_COLL_THREADS of the source
	collMaxBlocks = 64  // SYMMEM_DEV_COLL_MAX_BLOCKS
	collParamSize = 88  // sizeof(symmem_coll_params), checked by static_assert there
)

// kernelModule is one device's loaded collectives: one module per kernel
// (compiled as separate programs, at once: Note [Kernels compiled at run
// time]).
type kernelModule struct {
	modules [len(kernelNames)]C.uintptr_t
	fns     [len(kernelNames)]C.uintptr_t
	sms     int
	info    core.KernelInfo
}

// compileOptions are NVRTC's options for arch (major*10+minor).
func compileOptions(arch int) []string {
	return []string{fmt.Sprintf("--gpu-architecture=sm_%d", arch), "--std=c++17", "-DSYMMEM_NVRTC=1"}
}

// CompileKernel compiles kernel k of the embedded collectives (kernelNames[k]
// alone, SYMMEM_COLL_ONLY=k) for arch with nv: step 3 without the cache.
func CompileKernel(nv *NVRTC, arch, k int) ([]byte, error) {
	img, _, err := nv.Compile("collectives.cu", collectivesSource,
		[]Header{{Name: "symmem_device.cuh", Source: include.DeviceHeader}},
		append(compileOptions(arch), fmt.Sprintf("-DSYMMEM_COLL_ONLY=%d", k)))
	return img, err
}

// cacheDir is where images are cached, or "" with the reason.
func cacheDir() (string, string) {
	if d := os.Getenv("SYMMEM_CACHE_DIR"); d != "" {
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

// buildImages is steps 2 and 3 for every kernel: the images for arch from
// the cache in dir ("" : no cache), compiled where missing or corrupt.
func buildImages(nv *NVRTC, arch int, dir string) (imgs [len(kernelNames)][]byte, info core.KernelInfo, err error) {
	key := cacheKey(collectivesSource, include.DeviceHeader, strings.Join(compileOptions(arch), " "),
		fmt.Sprintf("nvrtc %d.%d", nv.Major, nv.Minor))
	// The five programs at once: NVRTC is thread-safe, and the first use
	// then takes about the longest compile rather than their sum.
	var infos [len(kernelNames)]core.KernelInfo
	var errs [len(kernelNames)]error
	var wg sync.WaitGroup
	t0 := time.Now()
	for k := range kernelNames {
		wg.Add(1)
		go func() {
			defer wg.Done()
			imgs[k], infos[k], errs[k] = cachedImage(dir, fmt.Sprintf("collectives-%s-%d-sm_%d.cubin", key, k, arch),
				func() ([]byte, error) { return CompileKernel(nv, arch, k) })
		}()
	}
	wg.Wait()
	wall := ms(time.Since(t0))
	info = core.KernelInfo{Arch: arch, Compiler: nv.String(), FromCache: true, CachePath: dir}
	var notes []string
	for k := range kernelNames {
		if errs[k] != nil {
			return imgs, info, core.Errorf(core.CodeOf(errs[k]), "building the collectives' kernel %s: %v", kernelNames[k], errs[k])
		}
		info.FromCache = info.FromCache && infos[k].FromCache
		if infos[k].Note != "" {
			notes = append(notes, infos[k].Note)
		}
		if infos[k].CachePath == "" {
			info.CachePath = "" // not (all) cached
		}
	}
	if info.FromCache {
		info.LoadMs = wall
	} else {
		info.CompileMs = wall
	}
	info.Note = strings.Join(notes, "; ")
	return imgs, info, nil
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// kernels returns device d's module, loading it at first use.
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
	arch := major*10 + minor
	nv, err := LoadNVRTC()
	if err != nil {
		return nil, err
	}
	dir, why := cacheDir()
	imgs, info, err := buildImages(nv, arch, dir)
	if err != nil {
		return nil, core.Errorf(core.CodeOf(err), "cuda: device %d: %v", dev, err)
	}
	if why != "" {
		info.Note = strings.TrimPrefix(info.Note+"; "+why, "; ")
	}
	m := &kernelModule{sms: sms}
	t0 := time.Now()
	for k, n := range kernelNames {
		err := check(C.smcu_module_load(d.ctx, unsafe.Pointer(&imgs[k][0]), &m.modules[k]), dev)
		if err == nil {
			cn := C.CString(n)
			err = check(C.smcu_module_function(d.ctx, m.modules[k], cn, &m.fns[k]), dev)
			C.free(unsafe.Pointer(cn))
			if err != nil {
				C.smcu_module_unload(d.ctx, m.modules[k])
			}
		}
		if err != nil {
			for j := 0; j < k; j++ {
				C.smcu_module_unload(d.ctx, m.modules[j])
			}
			return nil, core.Errorf(core.CodeOf(err), "%v (kernel %s for sm_%d from %s)", err, n, arch, nv)
		}
	}
	info.LoadMs += ms(time.Since(t0))
	m.info = info
	d.kern = m
	return m, nil
}

// LoadKernels is core.KernelLoader: the collectives' kernels of device,
// compiled or read from the cache, and loaded.
func (b *Backend) LoadKernels(dev int) (core.KernelInfo, error) {
	m, err := b.kernels(dev)
	if err != nil {
		return core.KernelInfo{}, err
	}
	return m.info, nil
}

// collGrid is the launch geometry for c: blocks enough for one 16-byte item
// per thread, at most collMaxBlocks; threads per block collThreads, or for a
// single block only as many warps as its items (and the barrier's one thread
// per rank) need: a tiny collective's __syncthreads and launch wait on fewer
// warps. Every rank computes the same geometry from the same arguments,
// which the block-paired barriers need.
func collGrid(c *core.Collective) (blocks, threads uint32) {
	bytes := uint64(c.Count) * uint64(c.DType.Size())
	w := uint64(c.World)
	var work uint64
	switch {
	case c.Kind == core.AllGather:
		work = bytes * w
	case c.Kind == core.ReduceScatter || c.Algo == core.AlgoTwoShot:
		work = bytes / w
	default:
		work = bytes
	}
	items := (work + 15) / 16
	g := (items + collThreads - 1) / collThreads
	if g > 1 {
		return uint32(min(g, collMaxBlocks)), collThreads
	}
	t := (max(items, w, 1) + 31) / 32 * 32
	return 1, uint32(min(t, collThreads))
}

// packCollParams lays c out as symmem_coll_params (kernels/collectives.cu).
func packCollParams(c *core.Collective) [collParamSize]byte {
	var p [collParamSize]byte
	le := binary.LittleEndian
	le.PutUint64(p[0:], uint64(c.Buffers))
	le.PutUint64(p[8:], uint64(c.Pads))
	le.PutUint64(p[16:], uint64(c.PadSize))
	le.PutUint64(p[24:], c.TimeoutNs)
	le.PutUint32(p[32:], uint32(c.Rank))
	le.PutUint32(p[36:], uint32(c.World))
	le.PutUint64(p[40:], uint64(c.InOffset))
	le.PutUint64(p[48:], uint64(c.Out))
	le.PutUint64(p[56:], uint64(c.OutOffset))
	count := uint64(c.Count)
	if c.Kind == core.AllGather {
		count *= uint64(c.DType.Size())
	}
	le.PutUint64(p[64:], count)
	le.PutUint32(p[72:], uint32(c.Kind))
	le.PutUint32(p[76:], uint32(c.Algo))
	le.PutUint32(p[80:], uint32(c.Op))
	le.PutUint32(p[84:], uint32(c.Channel*collMaxBlocks))
	return p
}

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
	fn := m.fns[len(kernelNames)-1]
	if c.Kind != core.AllGather {
		fn = m.fns[c.DType]
	}
	params := packCollParams(c)
	blocks, threads := collGrid(c)
	return check(C.smcu_launch(d.ctx, fn, C.uint(blocks), C.uint(threads), C.uintptr_t(s), unsafe.Pointer(&params[0])), dev)
}
