package cuda

/*
#include <stdlib.h>
#include "nvrtc.h"
static int smnv_version(const smnv_table *t, int *major, int *minor) { return t->nvrtcVersion(major, minor); }
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
)

// EnvNVRTC names the variable that gives NVRTC's path.
const EnvNVRTC = "SYMMEM_LIBNVRTC"

// nvrtcSymbols is smnv_table in order (nvrtc.h). The cubin functions came
// with CUDA 11.1.
var nvrtcSymbols = []Symbol{
	{Name: "nvrtcVersion"}, {Name: "nvrtcGetErrorString"}, {Name: "nvrtcCreateProgram"},
	{Name: "nvrtcDestroyProgram"}, {Name: "nvrtcCompileProgram"}, {Name: "nvrtcGetProgramLogSize"},
	{Name: "nvrtcGetProgramLog"}, {Name: "nvrtcGetCUBINSize", Since: 11010}, {Name: "nvrtcGetCUBIN", Since: 11010},
}

// NVRTC is the loaded runtime compiler.
type NVRTC struct {
	Lib          *Library
	Major, Minor int
	tab          *C.smnv_table // C memory, never freed (the library is never closed)
}

var nvrtcState struct {
	mu sync.Mutex
	nv *NVRTC
}

// nvrtcSpecs are tried in order: CUDA 13 wheels keep their libraries in
// nvidia/cu13/lib, CUDA 12 wheels NVRTC's in nvidia/cuda_nvrtc/lib.
func nvrtcSpecs() []LibrarySpec {
	var out []LibrarySpec
	for _, w := range []string{"cu13", "cuda_nvrtc"} {
		out = append(out, LibrarySpec{What: "NVRTC", Env: EnvNVRTC, Sonames: []string{"libnvrtc.so.13", "libnvrtc.so.12"},
			Wheel: w, Toolkit: true, VersionName: func(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }})
	}
	return out
}

// LoadNVRTC finds and opens NVRTC (Note [Libraries loaded at run time]):
// the copy already loaded, $SYMMEM_LIBNVRTC, libnvrtc.so.13/.12, PyTorch's
// nvidia-* wheels, the CUDA toolkit. A failure is core.ErrUnavailable
// naming what to install; it is not remembered.
func LoadNVRTC() (*NVRTC, error) {
	nvrtcState.mu.Lock()
	defer nvrtcState.mu.Unlock()
	if nvrtcState.nv != nil {
		return nvrtcState.nv, nil
	}
	var lib *Library
	var err error
	for _, s := range nvrtcSpecs() {
		if lib, err = OpenLibrary(s); err == nil || env(EnvNVRTC) != "" {
			break
		}
	}
	if err != nil {
		return nil, core.Errorf(core.ErrUnavailable,
			"the collectives compile their kernels at first use with NVRTC, which was not found: %v. Install it: pip install nvidia-cuda-nvrtc (CUDA 13) or nvidia-cuda-nvrtc-cu12 (CUDA 12), or the CUDA toolkit, or set %s to libnvrtc.so's path",
			err, EnvNVRTC)
	}
	tab := (*C.smnv_table)(C.calloc(1, C.sizeof_smnv_table))
	if _, err := lib.Resolve(nvrtcSymbols, 0, "", unsafe.Pointer(tab)); err != nil {
		C.free(unsafe.Pointer(tab))
		return nil, err
	}
	var major, minor C.int
	if r := C.smnv_version(tab, &major, &minor); r != 0 {
		C.free(unsafe.Pointer(tab))
		return nil, core.Errorf(core.ErrUnavailable, "NVRTC %s: nvrtcVersion failed (%d)", core.Quote(lib.Path), int(r))
	}
	nvrtcState.nv = &NVRTC{Lib: lib, Major: int(major), Minor: int(minor), tab: tab}
	return nvrtcState.nv, nil
}

// String names the compiler for messages.
func (n *NVRTC) String() string { return fmt.Sprintf("NVRTC %d.%d (%s)", n.Major, n.Minor, n.Lib.Path) }

// Header is one in-memory header of a program.
type Header struct{ Name, Source string }

// Compile compiles src (named name) to a cubin with options opts. A
// compile error is core.ErrBackend carrying NVRTC's log.
func (n *NVRTC) Compile(name, src string, headers []Header, opts []string) (image []byte, log string, err error) {
	var frees []unsafe.Pointer
	defer func() {
		for _, p := range frees {
			C.free(p)
		}
	}()
	cstr := func(s string) *C.char {
		p := C.CString(s)
		frees = append(frees, unsafe.Pointer(p))
		return p
	}
	carray := func(ss []string) **C.char {
		if len(ss) == 0 {
			return nil
		}
		arr := (**C.char)(C.malloc(C.size_t(len(ss)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
		frees = append(frees, unsafe.Pointer(arr))
		s := unsafe.Slice(arr, len(ss))
		for i, v := range ss {
			s[i] = cstr(v)
		}
		return arr
	}
	var hsrc, hname []string
	for _, h := range headers {
		hsrc, hname = append(hsrc, h.Source), append(hname, h.Name)
	}
	var out C.smnv_output
	C.smnv_compile(n.tab, cstr(src), cstr(name), C.int(len(headers)), carray(hsrc), carray(hname),
		C.int(len(opts)), carray(opts), &out)
	if out.log != nil {
		log = C.GoString(out.log)
		C.free(unsafe.Pointer(out.log))
	}
	if out.res != 0 {
		what := ""
		if out.res_text != nil {
			what = C.GoString(out.res_text)
		}
		return nil, log, core.Errorf(core.ErrBackend, "%s: %s of %s failed: %s (%d)\n%s", n, C.GoString(out.call), name, what, int(out.res), log)
	}
	image = C.GoBytes(unsafe.Pointer(out.image), C.int(out.image_len))
	C.free(unsafe.Pointer(out.image))
	return image, log, nil
}
