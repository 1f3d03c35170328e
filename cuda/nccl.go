package cuda

/*
#include <stdlib.h>
#include "nccl.h"
#include "shim.h"

// Calls ncclGetVersion through a bare pointer: the version decides which
// symbols the table needs, so it is asked before the table is resolved.
typedef int (*smnc_version_fn)(int *);
static int smnc_call_version(void *fn, int *v) { return ((smnc_version_fn)fn)(v); }
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
)

// EnvNCCL names the variable that gives NCCL's path explicitly.
const EnvNCCL = "SYMMEM_LIBNCCL"

// NCCLMinVersion is the oldest NCCL libsymmem uses: 2.28, the first with
// the window registration (ncclCommWindowRegister with
// NCCL_WIN_COLL_SYMMETRIC on cuMem memory) that torch 2.11's NCCL 2.28.9
// was seen to accept on libsymmem's segments.
const NCCLMinVersion = 22800

// ncclSpec finds NCCL (Note [Libraries loaded at run time]): under PyTorch
// the copy torch loaded from its nvidia-nccl wheel is already there.
var ncclSpec = LibrarySpec{What: "NCCL", Env: EnvNCCL, Sonames: []string{"libnccl.so.2", "libnccl.so"},
	Wheel: "nccl", Toolkit: true, VersionName: ncclVersionName}

// ncclSymbols is nccl.h's SM_NCCL_FUNCTIONS with the version that
// introduced each; same order.
var ncclSymbols = []Symbol{
	{Name: "ncclGetVersion"},
	{Name: "ncclGetErrorString"},
	{Name: "ncclGetLastError", Since: 21300},
	{Name: "ncclCommUserRank"},
	{Name: "ncclCommCount"},
	{Name: "ncclCommCuDevice"},
	{Name: "ncclAllGather"},
	{Name: "ncclCommWindowRegister", Since: 22700},
	{Name: "ncclCommWindowDeregister", Since: 22700},
	// Host-side peer pointers: the rendezvous check of NCCL's view of the
	// peers' windows (Note [NCCL groups] in core/symm) runs where present.
	{Name: "ncclGetPeerDevicePointer", Since: 22900, Optional: true},
}

// NCCLInfo describes the NCCL loaded in the process.
type NCCLInfo struct {
	Path    string
	How     string // which step of the search found it
	Version int    // ncclGetVersion: 22809 for 2.28.9
	// PeerPointers: ncclGetPeerDevicePointer is there (NCCL >= 2.29).
	PeerPointers bool
}

// VersionText is Version as "2.28.9".
func (i NCCLInfo) VersionText() string { return ncclVersionName(i.Version) }

// NCCL is loaded at most once per process, the first time a caller asks
// (LoadNCCL): a process that never makes an NCCL group never loads it.
// Failures are not remembered, so a caller can fix SYMMEM_LIBNCCL and retry.
var (
	ncclMu   sync.Mutex
	ncclInfo *NCCLInfo // nil until loaded
)

// LoadNCCL finds NCCL, checks its version and resolves its table, once.
// It fails with core.ErrUnavailable saying what was found and what is
// needed.
func LoadNCCL() (NCCLInfo, error) {
	ncclMu.Lock()
	defer ncclMu.Unlock()
	if ncclInfo != nil {
		return *ncclInfo, nil
	}
	lib, err := OpenLibrary(ncclSpec)
	if err != nil {
		return NCCLInfo{}, core.Errorf(core.ErrUnavailable, "nccl: %v", err)
	}
	fn := lib.Sym("ncclGetVersion")
	if fn == nil {
		return NCCLInfo{}, core.Errorf(core.ErrUnavailable, "nccl: %s (found as %s) has no ncclGetVersion: it is not NCCL", core.Quote(lib.Path), lib.How)
	}
	var v C.int
	if r := C.smnc_call_version(fn, &v); r != C.SM_NCCL_SUCCESS {
		return NCCLInfo{}, core.Errorf(core.ErrUnavailable, "nccl: ncclGetVersion of %s failed with result %d", core.Quote(lib.Path), int(r))
	}
	info := NCCLInfo{Path: lib.Path, How: lib.How, Version: int(v)}
	if info.Version < NCCLMinVersion {
		return NCCLInfo{}, core.Errorf(core.ErrUnavailable,
			"nccl: %s (found as %s) is NCCL %s; libsymmem needs NCCL %s or newer (symmetric window registration); set %s to a newer libnccl.so.2",
			core.Quote(lib.Path), lib.How, info.VersionText(), ncclVersionName(NCCLMinVersion), EnvNCCL)
	}
	tab := C.malloc(C.size_t(len(ncclSymbols)) * C.size_t(unsafe.Sizeof(uintptr(0))))
	defer C.free(tab)
	if int(C.smnc_symbol_count) != len(ncclSymbols) {
		return NCCLInfo{}, core.Errorf(core.ErrInternal, "nccl: the symbol lists of nccl.h and nccl.go differ")
	}
	if _, err := lib.Resolve(ncclSymbols, info.Version, info.VersionText(), tab); err != nil {
		return NCCLInfo{}, core.Errorf(core.ErrUnavailable, "nccl: %v", err)
	}
	C.smnc_install(tab)
	info.PeerPointers = C.smnc_has_peer_pointer() != 0
	ncclInfo = &info
	return info, nil
}

// NCCLComm is a communicator a caller owns (an ncclComm_t), seen through
// the functions libsymmem needs. It never destroys or aborts it.
type NCCLComm struct {
	ptr                 uintptr
	rank, world, device int
	info                NCCLInfo
	// ctx is the device's primary context, made current around NCCL calls
	// (they run on whatever OS thread a goroutine is on); 0 when the driver
	// is not loaded (the host backend with the NCCL stand-in). One
	// reference, retained by OpenNCCLComm, is kept for the process's life.
	ctx C.uintptr_t
}

// OpenNCCLComm loads NCCL (LoadNCCL) and reads ptr's rank, size and device.
func OpenNCCLComm(ptr uintptr) (*NCCLComm, error) {
	if ptr == 0 {
		return nil, core.Errorf(core.ErrInvalidArgument, "nccl: the communicator is NULL")
	}
	info, err := LoadNCCL()
	if err != nil {
		return nil, err
	}
	c := &NCCLComm{ptr: ptr, info: info}
	var v C.int
	if r := C.smnc_comm_user_rank(C.uintptr_t(ptr), &v); r != 0 {
		return nil, c.fail("ncclCommUserRank", r)
	}
	c.rank = int(v)
	if r := C.smnc_comm_count(C.uintptr_t(ptr), &v); r != 0 {
		return nil, c.fail("ncclCommCount", r)
	}
	c.world = int(v)
	if r := C.smnc_comm_cu_device(C.uintptr_t(ptr), &v); r != 0 {
		return nil, c.fail("ncclCommCuDevice", r)
	}
	c.device = int(v)
	if driverReady.Load() {
		cu, err := cuDevice(c.device)
		if err != nil {
			return nil, core.Errorf(core.CodeOf(err), "nccl: the communicator's device %d: %v", c.device, err)
		}
		if err := check(C.smcu_primary_retain(cu, &c.ctx), c.device); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// ncclResultCode maps an ncclResult_t to a core.Code: ncclUnhandledCudaError
// 1, ncclSystemError 2, ncclInternalError 3, ncclInvalidArgument 4,
// ncclInvalidUsage 5, ncclRemoteError 6, ncclInProgress 7.
func ncclResultCode(res int) core.Code {
	switch res {
	case 0:
		return core.Success
	case 4:
		return core.ErrInvalidArgument
	case 5:
		return core.ErrInvalidState
	case 6:
		return core.ErrPeer
	default:
		return core.ErrBackend
	}
}

// fail is the error for call returning res: NCCL's own words for the
// result (ncclGetErrorString) and for what went wrong (ncclGetLastError).
func (c *NCCLComm) fail(call string, res C.int) error {
	msg := fmt.Sprintf("nccl: %s failed with result %d", call, int(res))
	if s := C.smnc_error_string(res); s != nil {
		msg += " (" + C.GoString(s) + ")"
	}
	if s := C.smnc_last_error(C.uintptr_t(c.ptr)); s != nil {
		if t := strings.TrimSpace(C.GoString(s)); t != "" {
			msg += ": " + t
		}
	}
	return core.Errorf(ncclResultCode(int(res)), "%s", msg)
}

// Rank, World and Device are the communicator's (ncclCommUserRank,
// ncclCommCount, ncclCommCuDevice).
func (c *NCCLComm) Rank() int   { return c.rank }
func (c *NCCLComm) World() int  { return c.world }
func (c *NCCLComm) Device() int { return c.device }

// Pointer is the ncclComm_t.
func (c *NCCLComm) Pointer() uintptr { return c.ptr }

// Info describes the NCCL in use.
func (c *NCCLComm) Info() NCCLInfo { return c.info }

// Describe names the communicator for messages.
func (c *NCCLComm) Describe() string {
	return fmt.Sprintf("NCCL %s communicator %#x (rank %d of %d, device %d)", c.info.VersionText(), c.ptr, c.rank, c.world, c.device)
}

// AllGather enqueues ncclAllGather of bytesPerRank bytes per rank from
// send into recv (device memory) on stream.
func (c *NCCLComm) AllGather(stream core.Stream, send, recv, bytesPerRank uintptr) error {
	if r := C.smnc_all_gather(c.ctx, C.uintptr_t(c.ptr), C.uintptr_t(stream), C.ulonglong(send), C.ulonglong(recv), C.size_t(bytesPerRank)); r != 0 {
		return c.fail("ncclAllGather", r)
	}
	return nil
}

// RegisterWindow registers [addr, addr+size) as a symmetric window
// (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC). Collective.
func (c *NCCLComm) RegisterWindow(addr, size uintptr) (uintptr, error) {
	var w C.uintptr_t
	if r := C.smnc_window_register(c.ctx, C.uintptr_t(c.ptr), C.ulonglong(addr), C.size_t(size), &w); r != 0 {
		return 0, c.fail(fmt.Sprintf("ncclCommWindowRegister(%#x, %d bytes, NCCL_WIN_COLL_SYMMETRIC)", addr, size), r)
	}
	if w == 0 {
		return 0, core.Errorf(core.ErrBackend, "nccl: ncclCommWindowRegister(%#x, %d bytes) returned success and no window", addr, size)
	}
	return uintptr(w), nil
}

// DeregisterWindow undoes RegisterWindow.
func (c *NCCLComm) DeregisterWindow(win uintptr) error {
	if r := C.smnc_window_deregister(c.ctx, C.uintptr_t(c.ptr), C.uintptr_t(win)); r != 0 {
		return c.fail("ncclCommWindowDeregister", r)
	}
	return nil
}

// PeerPointer is ncclGetPeerDevicePointer(win, offset, peer): where peer's
// window is mapped here in NCCL's view (0 when NCCL cannot reach it by load
// and store). ok is false when this NCCL (< 2.29) lacks the function.
func (c *NCCLComm) PeerPointer(win, offset uintptr, peer int) (ptr uintptr, ok bool, err error) {
	if C.smnc_has_peer_pointer() == 0 {
		return 0, false, nil
	}
	var p C.ulonglong
	if r := C.smnc_peer_pointer(c.ctx, C.uintptr_t(win), C.size_t(offset), C.int(peer), &p); r != 0 {
		return 0, true, c.fail("ncclGetPeerDevicePointer", r)
	}
	return uintptr(p), true, nil
}
