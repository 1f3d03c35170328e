package cuda

/*
#include <stdlib.h>
#include "dynlib.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Libraries loaded at run time]
//
// The CUDA driver, NCCL and NVRTC are never linked: each is found and opened
// at run time by OpenLibrary, in one order (LibrarySpec.candidates):
//
//  1. a copy already loaded in the process (dlopen with RTLD_NOLOAD, by the
//     explicit path if one is set, then by each soname). Under PyTorch the
//     right NCCL and NVRTC are already there, and a communicator made by
//     one NCCL must be used with that NCCL, never a second copy.
//  2. the explicit variable (SYMMEM_LIBCUDA, SYMMEM_LIBNCCL,
//     SYMMEM_LIBNVRTC), a path. It is an order, not a hint: when it is set
//     and cannot be opened, loading fails naming it (nothing else is tried),
//     and when another copy of the library is already loaded (step 1 by
//     soname) it is an error that names both, since two copies of one
//     library in a process do not share their state.
//  3. the usual sonames, through the dynamic linker's search path.
//  4. the folders of PyTorch's nvidia-* wheels, site-packages/nvidia/<wheel>/lib,
//     looked for above the folders of every object already loaded (torch's
//     libraries live in site-packages/torch/lib) and under the Python
//     prefixes that $VIRTUAL_ENV, $CONDA_PREFIX and the running executable
//     suggest.
//  5. the CUDA toolkit: $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64.
//
// Functions are then resolved into a C table of function pointers
// (Library.Resolve) from a list that says, per symbol, the library version
// that introduced it (nccl's cudawrap.h does this for the driver). A
// required symbol that is missing is SYMMEM_ERROR_UNAVAILABLE naming the
// file, its version, the function and the version that has it; an optional
// one (a newer feature) is left NULL and the caller offers less.
// Libraries are never closed: handles into them (communicators, contexts)
// may live as long as the process.

// LibrarySpec says how to find one library.
type LibrarySpec struct {
	What    string   // for messages: "the CUDA driver", "NCCL"
	Env     string   // the explicit variable: "SYMMEM_LIBNCCL"
	Sonames []string // "libnccl.so.2", tried in order
	Wheel   string   // the nvidia-* wheel's folder name ("nccl"), or ""
	Toolkit bool     // also look in the CUDA toolkit's lib64 folders
	// VersionName spells a version code for messages (nil: the number).
	VersionName func(int) string
}

// Library is an opened library.
type Library struct {
	Spec LibrarySpec
	// Path is the file it came from: the explicit path as given, else the
	// path the dynamic linker reports, else the name it was opened by.
	Path string
	// How says which step found it: "already loaded", "$SYMMEM_LIBNCCL",
	// "soname", "wheel folder", "toolkit folder".
	How    string
	handle unsafe.Pointer
}

// candidate is one place to try.
type candidate struct {
	path, how string
}

// env reads a variable: the settings through core (read once, Note
// [Settings]), others (tests' own names, VIRTUAL_ENV, ...) from the
// environment. Tests replace it.
var env = func(name string) string {
	if core.IsSetting(name) {
		return core.Current().Text(name, "")
	}
	return os.Getenv(name)
}

// loadedObjects lists the paths of the objects loaded in the process.
func loadedObjects() []string {
	buf := make([]byte, 64<<10)
	for {
		n := int(C.smdl_loaded_objects((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf))))
		if n <= len(buf) {
			return strings.Fields(string(buf[:n]))
		}
		buf = make([]byte, n+4096)
	}
}

// searchDirs lists, in order, the folders of steps 4 and 5 for s, given the
// objects already loaded: the existing ones only, each once.
func (s LibrarySpec) searchDirs(loaded []string) []candidate {
	var out []candidate
	seen := map[string]bool{}
	add := func(dir, how string) {
		if dir == "" || seen[dir] {
			return
		}
		seen[dir] = true
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			out = append(out, candidate{dir, how})
		}
	}
	if s.Wheel != "" {
		wheel := filepath.Join("nvidia", s.Wheel, "lib")
		// Above every loaded object: .../site-packages/torch/lib/x.so has
		// site-packages three levels up; look up to four.
		for _, obj := range loaded {
			d := filepath.Dir(obj)
			for i := 0; i < 4 && d != "/" && d != "."; i++ {
				d = filepath.Dir(d)
				add(filepath.Join(d, wheel), "wheel folder")
			}
		}
		var prefixes []string
		for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
			if p := env(v); p != "" {
				prefixes = append(prefixes, p)
			}
		}
		if exe, err := os.Executable(); err == nil {
			prefixes = append(prefixes, filepath.Dir(filepath.Dir(exe))) // <prefix>/bin/python3
		}
		for _, p := range prefixes {
			for _, sp := range []string{"lib/python3*/site-packages", "lib/python3*/dist-packages", "local/lib/python3*/dist-packages"} {
				m, _ := filepath.Glob(filepath.Join(p, sp))
				for _, d := range m {
					add(filepath.Join(d, wheel), "wheel folder")
				}
			}
		}
	}
	if s.Toolkit {
		for _, v := range []string{"CUDA_HOME", "CUDA_PATH"} {
			if p := env(v); p != "" {
				add(filepath.Join(p, "lib64"), "toolkit folder")
			}
		}
		add("/usr/local/cuda/lib64", "toolkit folder")
	}
	return out
}

// openC calls smdl_open.
func openC(path string, noload bool) (unsafe.Pointer, string) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	nl := C.int(0)
	if noload {
		nl = 1
	}
	h := C.smdl_open(cpath, nl, &msg[0], C.size_t(len(msg)))
	return h, C.GoString(&msg[0])
}

// withoutPath is the loader's message msg about path without path in it
// (the message quotes the path once already, Note [Bounded messages]):
// dlerror starts with the path, and cuts it when it is long.
func withoutPath(msg, path string) string {
	if path == "" {
		return msg
	}
	if i := strings.Index(msg, path); i >= 0 {
		return strings.TrimLeft(msg[:i]+msg[i+len(path):], ": ")
	}
	if strings.HasPrefix(path, msg) {
		return "the loader's message names only the path"
	}
	return msg
}

// realPath is the file the dynamic linker loaded h from, or name.
func realPath(h unsafe.Pointer, name string) string {
	var buf [4096]C.char
	if C.smdl_path(h, &buf[0], C.size_t(len(buf))) == 0 {
		return C.GoString(&buf[0])
	}
	return name
}

// OpenLibrary finds and opens the library s describes (Note [Libraries
// loaded at run time]). It fails with core.ErrUnavailable saying what was
// tried and why each failed.
func OpenLibrary(s LibrarySpec) (*Library, error) {
	explicit := ""
	if s.Env != "" {
		explicit = env(s.Env)
	}
	found := func(h unsafe.Pointer, name, how string) *Library {
		p := name
		if how != "$"+s.Env {
			p = realPath(h, name)
		}
		return &Library{Spec: s, Path: p, How: how, handle: h}
	}
	// 1. Already loaded.
	if explicit != "" {
		if h, _ := openC(explicit, true); h != nil {
			return found(h, explicit, "$"+s.Env), nil
		}
	}
	for _, name := range s.Sonames {
		if h, _ := openC(name, true); h != nil {
			if explicit != "" {
				return nil, core.Errorf(core.ErrUnavailable,
					"cannot load %s from %s=%s: another copy is already loaded in this process (%s); unset %s or point it at that file",
					s.What, s.Env, core.Quote(explicit), realPath(h, name), s.Env)
			}
			return found(h, name, "already loaded"), nil
		}
	}
	// 2. The explicit path, and nothing else.
	if explicit != "" {
		h, msg := openC(explicit, false)
		if h == nil {
			return nil, core.Errorf(core.ErrUnavailable, "cannot load %s from %s=%s: %s", s.What, s.Env, core.Quote(explicit), withoutPath(msg, explicit))
		}
		return found(h, explicit, "$"+s.Env), nil
	}
	// 3. Sonames, 4./5. folders.
	var tried []string
	for _, name := range s.Sonames {
		h, msg := openC(name, false)
		if h != nil {
			return found(h, name, "soname"), nil
		}
		tried = append(tried, msg)
	}
	for _, d := range s.searchDirs(loadedObjects()) {
		for _, name := range s.Sonames {
			p := filepath.Join(d.path, name)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			h, msg := openC(p, false)
			if h != nil {
				return found(h, p, d.how), nil
			}
			tried = append(tried, msg)
		}
	}
	where := "the dynamic linker's search path"
	if s.Wheel != "" {
		where += ", site-packages/nvidia/" + s.Wheel + "/lib"
	}
	if s.Toolkit {
		where += ", $CUDA_HOME/lib64, /usr/local/cuda/lib64"
	}
	env := ""
	if s.Env != "" {
		env = "; set " + s.Env + " to its path"
	}
	return nil, core.Errorf(core.ErrUnavailable, "cannot load %s: %s not found in %s (%s)%s",
		s.What, strings.Join(s.Sonames, " or "), where, strings.Join(tried, "; "), env)
}

// Sym is dlsym(name) in the library, or nil.
func (l *Library) Sym(name string) unsafe.Pointer {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.smdl_sym(l.handle, cname)
}

// Symbol is one function of a library's table.
type Symbol struct {
	Name string
	// Alt are older names with the same signature, tried when Name is
	// missing (cuDeviceGetUuid for cuDeviceGetUuid_v2).
	Alt []string
	// Since is the library version that introduced it (the library's own
	// encoding: NCCL 2.28.0 is 22800), 0 when it has always been there.
	Since int
	// Optional symbols may be missing (left NULL): a newer feature.
	Optional bool
}

// Resolve fills table, a C array of len(syms) function pointers (a struct
// of function pointers in syms' order), from the library. version and
// versionText describe the library for messages. A missing required
// symbol fails with core.ErrUnavailable; missing optional ones are
// returned by name. Nothing is written to table unless every required
// symbol resolved.
func (l *Library) Resolve(syms []Symbol, version int, versionText string, table unsafe.Pointer) (missing []string, err error) {
	ptrs := make([]unsafe.Pointer, len(syms))
	for i, s := range syms {
		p := l.Sym(s.Name)
		for _, a := range s.Alt {
			if p == nil {
				p = l.Sym(a)
			}
		}
		if p == nil {
			if s.Optional {
				missing = append(missing, s.Name)
				continue
			}
			return nil, l.tooOld(s, version, versionText)
		}
		ptrs[i] = p
	}
	slots := unsafe.Slice((*unsafe.Pointer)(table), len(syms))
	copy(slots, ptrs)
	return missing, nil
}

// tooOld is the error for a missing required symbol.
func (l *Library) tooOld(s Symbol, version int, versionText string) error {
	what := fmt.Sprintf("%s %s", l.Spec.What, core.Quote(l.Path))
	if versionText != "" {
		what += " (version " + versionText + ")"
	}
	need := "it is too old"
	if s.Since > 0 {
		need = fmt.Sprintf("it is too old: %s came with version %s", s.Name, l.Spec.versionName(s.Since))
	}
	return core.Errorf(core.ErrUnavailable, "cuda: %s has no function %s: %s", what, s.Name, need)
}

// versionName spells v with s.VersionName, or as a number.
func (s LibrarySpec) versionName(v int) string {
	if s.VersionName != nil {
		return s.VersionName(v)
	}
	return fmt.Sprint(v)
}

// ncclVersionName spells an NCCL version code: major*10000 + minor*100 +
// patch since 2.9 (22809 is 2.28.9), major*1000 + minor*100 + patch before.
func ncclVersionName(v int) string {
	if v >= 20900 {
		return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/1000, v/100%10, v%100)
}
