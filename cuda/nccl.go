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
	// Typed collectives and communicator splits (the engine between
	// machines: Note [NCCL as the engine]).
	{Name: "ncclAllReduce"},
	{Name: "ncclReduceScatter"},
	{Name: "ncclCommSplit", Since: 21800},
	{Name: "ncclCommDestroy"},
	// The one-sided API: signals to a peer, waits for them, puts into a
	// peer's window with a signal (NCCL 2.29).
	{Name: "ncclSignal", Since: 22900, Optional: true},
	{Name: "ncclWaitSignal", Since: 22900, Optional: true},
	{Name: "ncclPutSignal", Since: 22900, Optional: true},
	// The host's view of NCCL's LSA team (its device API).
	{Name: "ncclTeamLsa", Since: 22800, Optional: true},
	// Point-to-point transfers in groups (the all-to-all across machines).
	{Name: "ncclSend", Since: 20700},
	{Name: "ncclRecv", Since: 20700},
	{Name: "ncclGroupStart"},
	{Name: "ncclGroupEnd"},
}

// NCCLInfo describes the NCCL loaded in the process.
type NCCLInfo struct {
	Path    string
	How     string // which step of the search found it
	Version int    // ncclGetVersion: 22809 for 2.28.9
	// PeerPointers: ncclGetPeerDevicePointer is there (NCCL >= 2.29).
	PeerPointers bool
	// OneSided: ncclSignal, ncclWaitSignal and ncclPutSignal are there
	// (NCCL >= 2.29).
	OneSided bool
	// LSATeam: ncclTeamLsa is there.
	LSATeam bool
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
	info.OneSided = C.smnc_has_one_sided() != 0
	info.LSATeam = C.smnc_has_team_lsa() != 0
	ncclInfo = &info
	return info, nil
}

// NCCLComm is a communicator (an ncclComm_t) seen through the functions
// libsymmem needs. One from OpenNCCLComm belongs to its caller: libsymmem
// never destroys or aborts it. One from Split belongs to whoever split it:
// Close destroys it.
type NCCLComm struct {
	ptr                 uintptr
	rank, world, device int
	info                NCCLInfo
	// owned: made by Split; Close destroys it (once: closed).
	owned  bool
	mu     sync.Mutex
	closed bool
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
	if err := c.readShape(); err != nil {
		return nil, err
	}
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

// readShape reads the communicator's rank, size and device.
func (c *NCCLComm) readShape() error {
	var v C.int
	if r := C.smnc_comm_user_rank(C.uintptr_t(c.ptr), &v); r != 0 {
		return c.fail("ncclCommUserRank", r)
	}
	c.rank = int(v)
	if r := C.smnc_comm_count(C.uintptr_t(c.ptr), &v); r != 0 {
		return c.fail("ncclCommCount", r)
	}
	c.world = int(v)
	if r := C.smnc_comm_cu_device(C.uintptr_t(c.ptr), &v); r != 0 {
		return c.fail("ncclCommCuDevice", r)
	}
	c.device = int(v)
	return nil
}

// ncclResultCode maps an ncclResult_t to a core.Code: ncclUnhandledCudaError
// 1, ncclSystemError 2, ncclInternalError 3, ncclInvalidArgument 4,
// ncclInvalidUsage 5, ncclRemoteError 6, ncclInProgress 7, ncclTimeout 8.
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
	case 8:
		return core.ErrTimeout
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
	if t := c.lastError(); t != "" {
		msg += ": " + t
	}
	return core.Errorf(ncclResultCode(int(res)), "%s", msg)
}

// lastError is ncclGetLastError's text ("" when none).
func (c *NCCLComm) lastError() string {
	if s := C.smnc_last_error(C.uintptr_t(c.ptr)); s != nil {
		return strings.TrimSpace(C.GoString(s))
	}
	return ""
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
	if err := c.usable("ncclAllGather"); err != nil {
		return err
	}
	if r := C.smnc_all_gather(c.ctx, C.uintptr_t(c.ptr), C.uintptr_t(stream), C.ulonglong(send), C.ulonglong(recv), C.size_t(bytesPerRank), C.SM_NCCL_UINT8); r != 0 {
		return c.fail("ncclAllGather", r)
	}
	return nil
}

// RegisterWindow registers [addr, addr+size) as a symmetric window
// (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC). Collective.
func (c *NCCLComm) RegisterWindow(addr, size uintptr) (uintptr, error) {
	if err := c.usable("ncclCommWindowRegister"); err != nil {
		return 0, err
	}
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
	if err := c.usable("ncclCommWindowDeregister"); err != nil {
		return err
	}
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
	if err := c.usable("ncclGetPeerDevicePointer"); err != nil {
		return 0, true, err
	}
	var p C.ulonglong
	if r := C.smnc_peer_pointer(c.ctx, C.uintptr_t(win), C.size_t(offset), C.int(peer), &p); r != 0 {
		return 0, true, c.fail("ncclGetPeerDevicePointer", r)
	}
	return uintptr(p), true, nil
}

// Note [NCCL as the engine]
//
// Between machines every byte travels through NCCL on the caller's
// communicator; libsymmem adds no transport of its own. The
// methods below are core's engine capabilities (Note [Engines] in
// core/engine.go), which core/symm finds by type assertion on a group's
// Communicator; an NCCLComm is that Communicator as it is:
//
//   - AllReduce, ReduceScatter, AllGatherTyped: ncclAllReduce,
//     ncclReduceScatter, ncclAllGather with the element type, enqueued on
//     the caller's stream (NCCL semantics: the call returns when enqueued,
//     and it may be captured in a CUDA graph). In place as NCCL defines it.
//     core's types and reductions map onto NCCL's one to one (ncclDataType
//     and ncclRedOp below); NCCL's order of reduction is its own (ring or
//     tree, by size and topology), so results across machines are
//     deterministic for a fixed communicator, size and NCCL version, not
//     bit-equal to the order of libsymmem's own kernels.
//   - Split: ncclCommSplit with a NULL config (the child inherits the
//     parent's configuration), for the hierarchical collectives; the child
//     belongs to the caller of Split, who destroys it with Close.
//   - Signal, WaitSignal, PutSignal: NCCL 2.29's one-sided API (ncclSignal,
//     ncclWaitSignal, ncclPutSignal), context 0, flags 0. NCCL 2.29 accepts
//     only signal index 0 (enqueue.cc refuses any other with
//     ncclInvalidArgument), and a communicator created with more signals
//     (ncclConfig_t.numRmaSig, later versions) does not say so, so
//     SignalSlots is 1: one counter per (sender, receiver). Without the API
//     (NCCL 2.28) the calls are core.ErrUnavailable naming the version found.
//   - SendRecv: ncclSend / ncclRecv of bytes (ncclUint8) between
//     ncclGroupStart and ncclGroupEnd, on the caller's stream: one group
//     per call, so that every transfer of an all-to-all progresses at once
//     (NCCL matches a pair's sends and receives in the order posted).
//   - LSAPeers: ncclTeamLsa, the ranks NCCL reaches by load/store from this
//     one (its machine or NVLink domain), to cross-check the group's own
//     local team.
//
// Every call is made with the device's primary context current, as the
// driver trampolines are (nccl.h), and every NCCL failure becomes a core
// error with NCCL's words for it (fail).

// NCCLSplitNoColor is NCCL_SPLIT_NOCOLOR: a rank splitting with it joins no
// new communicator.
const NCCLSplitNoColor = -1

// ncclDataType is nccl.h's ncclDataType_t for dt: ncclInt32 2, ncclFloat16
// 6, ncclFloat32 7, ncclBfloat16 9.
func ncclDataType(dt core.DType) (C.int, error) {
	switch dt {
	case core.Float32:
		return 7, nil
	case core.Float16:
		return 6, nil
	case core.BFloat16:
		return 9, nil
	case core.Int32:
		return 2, nil
	}
	return 0, core.Errorf(core.ErrInvalidArgument, "nccl: %v is not an element type libsymmem knows (float32, float16, bfloat16, int32)", dt)
}

// ncclRedOp is nccl.h's ncclRedOp_t for op: ncclSum 0, ncclMax 2, ncclMin 3
// (ncclProd 1 and ncclAvg 4 have no core.ReduceOp).
func ncclRedOp(op core.ReduceOp) (C.int, error) {
	switch op {
	case core.OpSum:
		return 0, nil
	case core.OpMax:
		return 2, nil
	case core.OpMin:
		return 3, nil
	}
	return 0, core.Errorf(core.ErrInvalidArgument, "nccl: the reduction %v has no NCCL equivalent (NCCL has sum, prod, max, min, avg; libsymmem sum, max, min)", op)
}

// usable fails when the communicator was destroyed by Close.
func (c *NCCLComm) usable(call string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return core.Errorf(core.ErrInvalidState, "nccl: %s on %s, which was destroyed (Close)", call, c.Describe())
	}
	return nil
}

// checkBuffers refuses NULL buffers for a call that moves elements.
func checkBuffers(call string, count uintptr, send, recv uintptr) error {
	if count > 0 && (send == 0 || recv == 0) {
		return core.Errorf(core.ErrInvalidArgument, "nccl: %s of %d elements with send=%#x recv=%#x: a buffer is NULL", call, count, send, recv)
	}
	return nil
}

// typedArgs checks a typed collective's buffers and maps its type and
// reduction (op < 0: none).
func (c *NCCLComm) typedArgs(call string, send, recv, count uintptr, dt core.DType, op core.ReduceOp, reduces bool) (C.int, C.int, error) {
	if err := c.usable(call); err != nil {
		return 0, 0, err
	}
	if err := checkBuffers(call, count, send, recv); err != nil {
		return 0, 0, err
	}
	t, err := ncclDataType(dt)
	if err != nil {
		return 0, 0, err
	}
	if !reduces {
		return t, 0, nil
	}
	o, err := ncclRedOp(op)
	return t, o, err
}

// AllReduce enqueues ncclAllReduce of count elements of dt from send into
// recv on stream (in place when send == recv).
func (c *NCCLComm) AllReduce(stream core.Stream, send, recv, count uintptr, dt core.DType, op core.ReduceOp) error {
	t, o, err := c.typedArgs("ncclAllReduce", send, recv, count, dt, op, true)
	if err != nil {
		return err
	}
	if r := C.smnc_all_reduce(c.ctx, C.uintptr_t(c.ptr), C.uintptr_t(stream), C.ulonglong(send), C.ulonglong(recv), C.size_t(count), t, o); r != 0 {
		return c.fail(fmt.Sprintf("ncclAllReduce(%d x %v, %v)", count, dt, op), r)
	}
	return nil
}

// ReduceScatter enqueues ncclReduceScatter: recv gets the reduction of
// every rank's send[rank*recvCount : (rank+1)*recvCount] (in place when
// recv == send + rank*recvCount*size).
func (c *NCCLComm) ReduceScatter(stream core.Stream, send, recv, recvCount uintptr, dt core.DType, op core.ReduceOp) error {
	t, o, err := c.typedArgs("ncclReduceScatter", send, recv, recvCount, dt, op, true)
	if err != nil {
		return err
	}
	if r := C.smnc_reduce_scatter(c.ctx, C.uintptr_t(c.ptr), C.uintptr_t(stream), C.ulonglong(send), C.ulonglong(recv), C.size_t(recvCount), t, o); r != 0 {
		return c.fail(fmt.Sprintf("ncclReduceScatter(%d x %v per rank, %v)", recvCount, dt, op), r)
	}
	return nil
}

// AllGatherTyped enqueues ncclAllGather of sendCount elements of dt per
// rank (in place when send == recv + rank*sendCount*size).
func (c *NCCLComm) AllGatherTyped(stream core.Stream, send, recv, sendCount uintptr, dt core.DType) error {
	t, _, err := c.typedArgs("ncclAllGather", send, recv, sendCount, dt, 0, false)
	if err != nil {
		return err
	}
	if r := C.smnc_all_gather(c.ctx, C.uintptr_t(c.ptr), C.uintptr_t(stream), C.ulonglong(send), C.ulonglong(recv), C.size_t(sendCount), t); r != 0 {
		return c.fail(fmt.Sprintf("ncclAllGather(%d x %v per rank)", sendCount, dt), r)
	}
	return nil
}

// Split is ncclCommSplit(comm, color, key, &child, NULL): collective over
// this communicator; ranks with the same color form the child, ordered by
// key (then by rank here). The child belongs to the caller, who destroys it
// with Close. With color NCCLSplitNoColor the rank joins none: (nil, nil),
// a nil interface (not one holding a nil *NCCLComm).
func (c *NCCLComm) Split(color, key int) (core.Communicator, error) {
	child, err := c.split(color, key)
	if child == nil {
		return nil, err
	}
	return child, err
}

// The engine capabilities an NCCLComm has (Note [Engines]).
var (
	_ core.Communicator  = (*NCCLComm)(nil)
	_ core.Reducer       = (*NCCLComm)(nil)
	_ core.Splitter      = (*NCCLComm)(nil)
	_ core.Closer        = (*NCCLComm)(nil)
	_ core.OneSided      = (*NCCLComm)(nil)
	_ core.SignalSlotter = (*NCCLComm)(nil)
	_ core.LSATeam       = (*NCCLComm)(nil)
	_ core.SendRecver    = (*NCCLComm)(nil)
)

func (c *NCCLComm) split(color, key int) (*NCCLComm, error) {
	if err := c.usable("ncclCommSplit"); err != nil {
		return nil, err
	}
	if color < 0 && color != NCCLSplitNoColor {
		return nil, core.Errorf(core.ErrInvalidArgument, "nccl: ncclCommSplit with color %d: a color is >= 0 or NCCL_SPLIT_NOCOLOR (-1)", color)
	}
	var child C.uintptr_t
	if r := C.smnc_comm_split(c.ctx, C.uintptr_t(c.ptr), C.int(color), C.int(key), &child); r != 0 {
		return nil, c.fail(fmt.Sprintf("ncclCommSplit(color %d, key %d)", color, key), r)
	}
	if child == 0 {
		if color == NCCLSplitNoColor {
			return nil, nil
		}
		return nil, core.Errorf(core.ErrBackend, "nccl: ncclCommSplit(color %d, key %d) on %s succeeded and gave no communicator", color, key, c.Describe())
	}
	n := &NCCLComm{ptr: uintptr(child), info: c.info, ctx: c.ctx, owned: true}
	if err := n.readShape(); err != nil {
		C.smnc_comm_destroy(c.ctx, child)
		return nil, err
	}
	return n, nil
}

// Close destroys a communicator made by Split (ncclCommDestroy), once; on
// one its caller owns (OpenNCCLComm) it does nothing: libsymmem never
// destroys those. Windows registered on it must be deregistered first.
func (c *NCCLComm) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.owned || c.closed {
		return nil
	}
	c.closed = true
	if r := C.smnc_comm_destroy(c.ctx, C.uintptr_t(c.ptr)); r != 0 {
		return c.fail("ncclCommDestroy", r)
	}
	return nil
}

// OneSided reports whether the loaded NCCL has the one-sided API (ncclSignal,
// ncclWaitSignal, ncclPutSignal: NCCL 2.29), and its version ("2.28.9").
func (c *NCCLComm) OneSided() (ok bool, version string) {
	return c.info.OneSided, c.info.VersionText()
}

// SignalSlots is the number of signal indices per peer that Signal,
// WaitSignal and PutSignal take (Note [NCCL as the engine]): 1.
func (c *NCCLComm) SignalSlots() int { return 1 }

// oneSidedArgs checks a one-sided call's peer and slot and that NCCL has
// the API.
func (c *NCCLComm) oneSidedArgs(call string, peer, slot int) error {
	if err := c.usable(call); err != nil {
		return err
	}
	if !c.info.OneSided {
		return core.Errorf(core.ErrUnavailable,
			"nccl: %s needs NCCL's one-sided API (ncclSignal, ncclWaitSignal, ncclPutSignal), which came with NCCL 2.29; the NCCL loaded is %s (%q): use NCCL 2.29 or newer (%s names it)",
			call, c.info.VersionText(), c.info.Path, EnvNCCL)
	}
	if peer < 0 || peer >= c.world {
		return core.Errorf(core.ErrInvalidArgument, "nccl: %s to peer %d: the communicator has ranks 0..%d", call, peer, c.world-1)
	}
	if slot < 0 || slot >= c.SignalSlots() {
		return core.Errorf(core.ErrInvalidArgument, "nccl: %s on signal slot %d: NCCL %s has %d signal slot(s) per peer (signal index 0)",
			call, slot, c.info.VersionText(), c.SignalSlots())
	}
	return nil
}

// oneSidedFail is the error of ncclSignal or ncclWaitSignal refused with
// res. Their arguments were checked here, so ncclInvalidArgument (4) means that
// NCCL cannot serve the call on this communicator: NCCL 2.29 refuses
// one-sided calls where the communicator lacks host RMA support (symmetric
// memory, and every rank in one LSA team or a network plugin with RMA).
// That is core.ErrUnavailable, so that a caller can fall back.
func (c *NCCLComm) oneSidedFail(call string, res C.int) error {
	err := c.fail(call, res)
	if res != 4 {
		return err
	}
	return core.Errorf(core.ErrUnavailable, "%v; NCCL %s serves one-sided calls only on communicators with host RMA support (symmetric memory, and every rank in one LSA team or an RMA-capable network plugin)",
		err, c.info.VersionText())
}

// Signal enqueues on stream one signal to peer's slot (ncclSignal).
func (c *NCCLComm) Signal(stream core.Stream, peer, slot int) error {
	if err := c.oneSidedArgs("ncclSignal", peer, slot); err != nil {
		return err
	}
	if r := C.smnc_signal(c.ctx, C.uintptr_t(c.ptr), C.uintptr_t(stream), C.int(peer), C.int(slot)); r != 0 {
		return c.oneSidedFail(fmt.Sprintf("ncclSignal(peer %d, signal %d)", peer, slot), r)
	}
	return nil
}

// WaitSignal enqueues on stream a wait for count signals from peer in this
// rank's slot (ncclWaitSignal with one descriptor); signals a wait counts
// are consumed. count 0 waits for nothing.
func (c *NCCLComm) WaitSignal(stream core.Stream, peer, slot, count int) error {
	if err := c.oneSidedArgs("ncclWaitSignal", peer, slot); err != nil {
		return err
	}
	if count < 0 {
		return core.Errorf(core.ErrInvalidArgument, "nccl: ncclWaitSignal for %d signals", count)
	}
	if count == 0 {
		return nil
	}
	if r := C.smnc_wait_signal(c.ctx, C.uintptr_t(c.ptr), C.uintptr_t(stream), C.int(peer), C.int(slot), C.int(count)); r != 0 {
		return c.oneSidedFail(fmt.Sprintf("ncclWaitSignal(peer %d, signal %d, %d signals)", peer, slot, count), r)
	}
	return nil
}

// PutSignal enqueues on stream a put of count elements of dt from send
// (inside a window of this communicator) into peer's window win at byte
// offset, then one signal to peer's slot (ncclPutSignal). win is this rank's
// handle of the window (windows are registered collectively).
func (c *NCCLComm) PutSignal(stream core.Stream, send, count uintptr, dt core.DType, peer int, win, offset uintptr, slot int) error {
	if err := c.oneSidedArgs("ncclPutSignal", peer, slot); err != nil {
		return err
	}
	if win == 0 || (count > 0 && send == 0) {
		return core.Errorf(core.ErrInvalidArgument, "nccl: ncclPutSignal with send=%#x window=%#x: NULL", send, win)
	}
	t, err := ncclDataType(dt)
	if err != nil {
		return err
	}
	if r := C.smnc_put_signal(c.ctx, C.uintptr_t(c.ptr), C.uintptr_t(stream), C.ulonglong(send), C.size_t(count), t,
		C.int(peer), C.uintptr_t(win), C.size_t(offset), C.int(slot)); r != 0 {
		return c.fail(fmt.Sprintf("ncclPutSignal(%d x %v to peer %d at offset %d, signal %d)", count, dt, peer, offset, slot), r)
	}
	return nil
}

// LSAPeers are the ranks NCCL reaches from this one by load and store (its
// LSA team: this machine, or this NVLink domain), this rank included, in
// increasing order. ok is false when this NCCL cannot say (no ncclTeamLsa).
func (c *NCCLComm) LSAPeers() (peers []int, ok bool, err error) {
	if err := c.usable("ncclTeamLsa"); err != nil {
		return nil, false, err
	}
	if !c.info.LSATeam {
		return nil, false, nil
	}
	var n, r, stride C.int
	C.smnc_team_lsa(c.ctx, C.uintptr_t(c.ptr), &n, &r, &stride)
	// ncclTeamLsa returns an empty team when NCCL could not set up its
	// device runtime; the reason is its last error.
	if n < 1 || r < 0 || r >= n || stride < 1 {
		return nil, true, core.Errorf(core.ErrBackend, "nccl: ncclTeamLsa on %s gave no team (%d ranks, rank %d, stride %d): NCCL could not set up its device runtime: %q",
			c.Describe(), int(n), int(r), int(stride), c.lastError())
	}
	for i := 0; i < int(n); i++ {
		w := c.rank + (i-int(r))*int(stride)
		if w < 0 || w >= c.world {
			return nil, true, core.Errorf(core.ErrBackend, "nccl: ncclTeamLsa gave a team (%d ranks, rank %d, stride %d) reaching rank %d of a communicator of %d",
				int(n), int(r), int(stride), w, c.world)
		}
		peers = append(peers, w)
	}
	return peers, true, nil
}
