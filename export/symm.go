package main

// The symmetric-memory section of include/symmem.h: marshalling only; the
// logic is in core/symm.

/*
#include "internal.h"

// symmem_allgather_fn, called through a trampoline (Go cannot call a C
// function pointer). static inline: this preamble is compiled twice.
typedef int (*symmemi_allgather_fn)(const void *send, void *recv, size_t bytes_per_rank, void *user);
static inline int symmemi_call_allgather(void *fn, const void *send, void *recv, size_t n, void *user) {
  return ((symmemi_allgather_fn)fn)(send, recv, n, user);
}
*/
import "C"

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/symm"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// Note [Opaque handles]
//
// C never sees a Go pointer. A symmem_group* or symmem_handle* is a key of
// the objects table: tag | kind | serial<<4, with a serial that is never
// reused, so a released or forged pointer is an unknown key (an error, not
// a use-after-free), a group passed as a handle is caught by its kind bits,
// and since the tag makes the value a non-canonical x86-64 address, a C
// caller that dereferences one faults at once instead of reading memory.
const (
	objTag    = uintptr(0x5359) << 48
	objGroup  = uintptr(1)
	objHandle = uintptr(2)
)

var objects = struct {
	sync.Mutex
	serial uintptr
	m      map[uintptr]any
}{m: map[uintptr]any{}}

func register(kind uintptr, obj any) uintptr {
	objects.Lock()
	defer objects.Unlock()
	objects.serial++
	key := objTag | objects.serial<<4 | kind
	objects.m[key] = obj
	return key
}

// lookup returns the object of key if it is of kind; with remove it also
// takes it out of the table (so that only one caller can release it).
func lookup(key, kind uintptr, remove bool) (any, error) {
	what := "group"
	if kind == objHandle {
		what = "handle"
	}
	if key == 0 {
		return nil, core.Errorf(core.ErrInvalidArgument, "the %s is NULL", what)
	}
	objects.Lock()
	defer objects.Unlock()
	obj, ok := objects.m[key]
	if !ok || key&0xf != kind {
		return nil, core.Errorf(core.ErrInvalidArgument, "%#x is not a live symmem_%s (never created here, already released, or another kind of object)", key, what)
	}
	if remove {
		delete(objects.m, key)
	}
	return obj, nil
}

func groupOf(key uintptr) (*symm.Group, error) {
	obj, err := lookup(key, objGroup, false)
	if err != nil {
		return nil, err
	}
	return obj.(*symm.Group), nil
}

func handleOf(key uintptr) (*symm.Handle, error) {
	obj, err := lookup(key, objHandle, false)
	if err != nil {
		return nil, err
	}
	return obj.(*symm.Handle), nil
}

// timeoutOf converts a C timeout_ms, saturating (Note [Timeouts saturate]).
// It has one meaning in every call that takes one (include/symmem.h,
// Python's symmem.Group): 0 is the default (the group's timeout; for a new
// group SYMMEM_TIMEOUT_MS, else 300000), a negative count is refused rather
// than read as the default.
func timeoutOf(ms C.int64_t) (time.Duration, error) {
	if ms < 0 {
		return 0, core.Errorf(core.ErrInvalidArgument,
			"timeout_ms %d is negative (0 means the default: the group's timeout, for a new group SYMMEM_TIMEOUT_MS or 300000)", int64(ms))
	}
	return core.Millis(int64(ms)), nil
}

func createGroup(call string, name *C.char, rank, world, device C.int, timeoutMs C.int64_t,
	allgather func(send, recv []byte) error, out *uintptr) C.int {
	if out == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "out is NULL"))
	}
	*out = 0
	if name == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "name is NULL"))
	}
	timeout, err := timeoutOf(timeoutMs)
	if err != nil {
		return setLastError(call, err)
	}
	rt, err := runtimeOrError()
	if err != nil {
		return setLastError(call, err)
	}
	g, err := symm.New(symm.Options{Name: C.GoString(name), Rank: int(rank), World: int(world), Device: int(device),
		Timeout: timeout, AllGather: allgather, Runtime: rt})
	if err != nil {
		return setLastError(call, err)
	}
	*out = register(objGroup, g)
	return 0
}

// groupCall describes a group creation's arguments but the name: the
// errors about a name quote it themselves (core.Quote, once; Note [Bounded
// messages]), and every error of a group names the group.
func groupCall(name *C.char, rank, world, device C.int) string {
	n := ""
	if name == nil {
		n = "name=NULL, "
	}
	return fmt.Sprintf("(%srank=%d, world_size=%d, device=%d)", n, int(rank), int(world), int(device))
}

//export symmemgo_group_create
func symmemgo_group_create(name *C.char, rank, world, device C.int, timeoutMs C.int64_t, out *uintptr) (result C.int) {
	defer recoverCall("symmem_group_create", &result, C.int(core.ErrInternal))
	return createGroup("symmem_group_create"+groupCall(name, rank, world, device), name, rank, world, device, timeoutMs, nil, out)
}

//export symmemgo_group_create_with_allgather
func symmemgo_group_create_with_allgather(name *C.char, rank, world, device C.int, timeoutMs C.int64_t,
	fn unsafe.Pointer, user unsafe.Pointer, out *uintptr) (result C.int) {
	defer recoverCall("symmem_group_create_with_allgather", &result, C.int(core.ErrInternal))
	call := "symmem_group_create_with_allgather" + groupCall(name, rank, world, device)
	if fn == nil {
		if out != nil {
			*out = 0
		}
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "allgather is NULL"))
	}
	allgather := func(send, recv []byte) error {
		if len(send) == 0 || len(recv) == 0 {
			return nil
		}
		// Go memory for the duration of the call, as cgo allows.
		if rc := C.symmemi_call_allgather(fn, unsafe.Pointer(&send[0]), unsafe.Pointer(&recv[0]), C.size_t(len(send)), user); rc != 0 {
			return fmt.Errorf("symmem_allgather_fn returned %d", int(rc))
		}
		return nil
	}
	return createGroup(call, name, rank, world, device, timeoutMs, allgather, out)
}

//export symmemgo_group_destroy
func symmemgo_group_destroy(group uintptr) (result C.int) {
	defer recoverCall("symmem_group_destroy", &result, C.int(core.ErrInternal))
	if group == 0 {
		return 0
	}
	obj, err := lookup(group, objGroup, true)
	if err != nil {
		return setLastError("symmem_group_destroy", err)
	}
	return setLastError("symmem_group_destroy", obj.(*symm.Group).Destroy())
}

//export symmemgo_group_abort
func symmemgo_group_abort(group uintptr) (result C.int) {
	defer recoverCall("symmem_group_abort", &result, C.int(core.ErrInternal))
	g, err := groupOf(group)
	if err == nil {
		err = g.Abort()
	}
	return setLastError("symmem_group_abort", err)
}

//export symmemgo_set_interrupt_fd
func symmemgo_set_interrupt_fd(fd C.int) (result C.int) {
	defer recoverCall("symmem_set_interrupt_fd", &result, C.int(core.ErrInternal))
	return setLastError(fmt.Sprintf("symmem_set_interrupt_fd(fd=%d)", int(fd)), core.SetInterruptFD(int(fd)))
}

func groupInt(call string, group uintptr, f func(*symm.Group) int) C.int {
	g, err := groupOf(group)
	if err != nil {
		setLastError(call, err)
		return -1
	}
	return C.int(f(g))
}

//export symmemgo_group_rank
func symmemgo_group_rank(group uintptr) (result C.int) {
	defer recoverCall("symmem_group_rank", &result, -1)
	return groupInt("symmem_group_rank", group, (*symm.Group).Rank)
}

//export symmemgo_group_world_size
func symmemgo_group_world_size(group uintptr) (result C.int) {
	defer recoverCall("symmem_group_world_size", &result, -1)
	return groupInt("symmem_group_world_size", group, (*symm.Group).World)
}

//export symmemgo_group_local_rank
func symmemgo_group_local_rank(group uintptr) (result C.int) {
	defer recoverCall("symmem_group_local_rank", &result, -1)
	return groupInt("symmem_group_local_rank", group, (*symm.Group).LocalRank)
}

//export symmemgo_group_local_size
func symmemgo_group_local_size(group uintptr) (result C.int) {
	defer recoverCall("symmem_group_local_size", &result, -1)
	return groupInt("symmem_group_local_size", group, (*symm.Group).LocalSize)
}

//export symmemgo_group_is_local
func symmemgo_group_is_local(group uintptr, rank C.int) (result C.int) {
	defer recoverCall("symmem_group_is_local", &result, -1)
	g, err := groupOf(group)
	var local bool
	if err == nil {
		local, err = g.IsLocal(int(rank))
	}
	if err != nil {
		setLastError("symmem_group_is_local", err)
		return -1
	}
	if local {
		return 1
	}
	return 0
}

//export symmemgo_group_machine
func symmemgo_group_machine(group uintptr, rank C.int, buf *C.char, length C.size_t) (result C.size_t) {
	defer recoverCall("symmem_group_machine", &result, 0)
	g, err := groupOf(group)
	var name string
	if err == nil {
		name, err = g.MachineOf(int(rank))
	}
	if err != nil {
		setLastError("symmem_group_machine", err)
		return 0
	}
	return copyOut([]byte(name), buf, length)
}

//export symmemgo_handle_mapped_peers
func symmemgo_handle_mapped_peers(handle uintptr) (result C.int) {
	defer recoverCall("symmem_handle_mapped_peers", &result, -1)
	h, err := handleOf(handle)
	if err != nil {
		setLastError("symmem_handle_mapped_peers", err)
		return -1
	}
	return C.int(h.MappedPeers())
}

//export symmemgo_group_device
func symmemgo_group_device(group uintptr) (result C.int) {
	defer recoverCall("symmem_group_device", &result, -1)
	return groupInt("symmem_group_device", group, (*symm.Group).Device)
}

//export symmemgo_group_set_signal_pad_size
func symmemgo_group_set_signal_pad_size(group uintptr, bytes C.size_t) (result C.int) {
	defer recoverCall("symmem_group_set_signal_pad_size", &result, C.int(core.ErrInternal))
	call := fmt.Sprintf("symmem_group_set_signal_pad_size(bytes=%d)", uint64(bytes))
	g, err := groupOf(group)
	if err == nil {
		err = g.SetSignalPadSize(uintptr(bytes))
	}
	return setLastError(call, err)
}

//export symmemgo_rendezvous
func symmemgo_rendezvous(ptr unsafe.Pointer, group uintptr, out *uintptr) (result C.int) {
	defer recoverCall("symmem_rendezvous", &result, C.int(core.ErrInternal))
	// The call is named only in a failure's message: a rendezvous again
	// formats nothing.
	fail := func(err error) C.int { return setLastError(fmt.Sprintf("symmem_rendezvous(ptr=%p)", ptr), err) }
	if out == nil {
		return fail(core.Errorf(core.ErrInvalidArgument, "out is NULL"))
	}
	*out = 0
	g, err := groupOf(group)
	if err != nil {
		return fail(err)
	}
	h, err := g.Rendezvous(uintptr(ptr))
	if err != nil {
		return fail(err)
	}
	*out = register(objHandle, h)
	return 0
}

//export symmemgo_handle_release
func symmemgo_handle_release(handle uintptr) (result C.int) {
	defer recoverCall("symmem_handle_release", &result, C.int(core.ErrInternal))
	if handle == 0 {
		return 0
	}
	obj, err := lookup(handle, objHandle, true)
	if err != nil {
		return setLastError("symmem_handle_release", err)
	}
	return setLastError("symmem_handle_release", obj.(*symm.Handle).Release())
}

func handleInt(call string, handle uintptr, f func(*symm.Handle) int) C.int {
	h, err := handleOf(handle)
	if err != nil {
		setLastError(call, err)
		return -1
	}
	return C.int(f(h))
}

func handleSize(call string, handle uintptr, f func(*symm.Handle) uintptr) C.size_t {
	h, err := handleOf(handle)
	if err != nil {
		setLastError(call, err)
		return 0
	}
	return C.size_t(f(h))
}

//export symmemgo_handle_rank
func symmemgo_handle_rank(handle uintptr) (result C.int) {
	defer recoverCall("symmem_handle_rank", &result, -1)
	return handleInt("symmem_handle_rank", handle, (*symm.Handle).Rank)
}

//export symmemgo_handle_world_size
func symmemgo_handle_world_size(handle uintptr) (result C.int) {
	defer recoverCall("symmem_handle_world_size", &result, -1)
	return handleInt("symmem_handle_world_size", handle, (*symm.Handle).World)
}

//export symmemgo_handle_buffer_size
func symmemgo_handle_buffer_size(handle uintptr) (result C.size_t) {
	defer recoverCall("symmem_handle_buffer_size", &result, 0)
	return handleSize("symmem_handle_buffer_size", handle, (*symm.Handle).BufferSize)
}

//export symmemgo_handle_offset
func symmemgo_handle_offset(handle uintptr) (result C.size_t) {
	defer recoverCall("symmem_handle_offset", &result, 0)
	return handleSize("symmem_handle_offset", handle, (*symm.Handle).Offset)
}

//export symmemgo_handle_signal_pad_size
func symmemgo_handle_signal_pad_size(handle uintptr) (result C.size_t) {
	defer recoverCall("symmem_handle_signal_pad_size", &result, 0)
	return handleSize("symmem_handle_signal_pad_size", handle, (*symm.Handle).SignalPadSize)
}

func handlePtr(call string, handle uintptr, f func(*symm.Handle) (uintptr, error)) unsafe.Pointer {
	h, err := handleOf(handle)
	if err == nil {
		var p uintptr
		if p, err = f(h); err == nil {
			return unmanaged.Pointer(p)
		}
	}
	setLastError(call, err)
	return nil
}

//export symmemgo_handle_buffer_ptr
func symmemgo_handle_buffer_ptr(handle uintptr, rank C.int) (result unsafe.Pointer) {
	defer recoverCall("symmem_handle_buffer_ptr", &result, nil)
	return handlePtr(fmt.Sprintf("symmem_handle_buffer_ptr(rank=%d)", int(rank)), handle,
		func(h *symm.Handle) (uintptr, error) { return h.BufferPtr(int(rank)) })
}

//export symmemgo_handle_signal_pad_ptr
func symmemgo_handle_signal_pad_ptr(handle uintptr, rank C.int) (result unsafe.Pointer) {
	defer recoverCall("symmem_handle_signal_pad_ptr", &result, nil)
	return handlePtr(fmt.Sprintf("symmem_handle_signal_pad_ptr(rank=%d)", int(rank)), handle,
		func(h *symm.Handle) (uintptr, error) { return h.SignalPadPtr(int(rank)) })
}

//export symmemgo_handle_buffer_ptrs
func symmemgo_handle_buffer_ptrs(handle uintptr) (result unsafe.Pointer) {
	defer recoverCall("symmem_handle_buffer_ptrs", &result, nil)
	return handlePtr("symmem_handle_buffer_ptrs", handle, func(h *symm.Handle) (uintptr, error) {
		host, _ := h.BufferPtrs()
		return host, nil
	})
}

//export symmemgo_handle_signal_pad_ptrs
func symmemgo_handle_signal_pad_ptrs(handle uintptr) (result unsafe.Pointer) {
	defer recoverCall("symmem_handle_signal_pad_ptrs", &result, nil)
	return handlePtr("symmem_handle_signal_pad_ptrs", handle, func(h *symm.Handle) (uintptr, error) {
		host, _ := h.SignalPadPtrs()
		return host, nil
	})
}

//export symmemgo_handle_buffer_ptrs_dev
func symmemgo_handle_buffer_ptrs_dev(handle uintptr) (result unsafe.Pointer) {
	defer recoverCall("symmem_handle_buffer_ptrs_dev", &result, nil)
	return handlePtr("symmem_handle_buffer_ptrs_dev", handle, func(h *symm.Handle) (uintptr, error) {
		_, dev := h.BufferPtrs()
		return dev, nil
	})
}

//export symmemgo_handle_describe
func symmemgo_handle_describe(handle uintptr, desc *C.symmem_handle_desc) (result C.int) {
	defer recoverCall("symmem_handle_describe", &result, C.int(core.ErrInternal))
	if desc == nil {
		return setLastError("symmem_handle_describe", core.Errorf(core.ErrInvalidArgument, "desc is NULL"))
	}
	h, err := handleOf(handle)
	if err != nil {
		return setLastError("symmem_handle_describe", err)
	}
	bufs, bufsDev := h.BufferPtrs()
	pads, padsDev := h.SignalPadPtrs()
	*desc = C.symmem_handle_desc{
		rank: C.int(h.Rank()), world_size: C.int(h.World()),
		buffer_size: C.size_t(h.BufferSize()), offset: C.size_t(h.Offset()), signal_pad_size: C.size_t(h.SignalPadSize()),
		buffer_ptrs: (*unsafe.Pointer)(unmanaged.Pointer(bufs)), signal_pad_ptrs: (*unsafe.Pointer)(unmanaged.Pointer(pads)),
		buffer_ptrs_dev: (*unsafe.Pointer)(unmanaged.Pointer(bufsDev)), signal_pad_ptrs_dev: (*unsafe.Pointer)(unmanaged.Pointer(padsDev)),
	}
	return C.SYMMEM_SUCCESS
}

//export symmemgo_handle_signal_pad_ptrs_dev
func symmemgo_handle_signal_pad_ptrs_dev(handle uintptr) (result unsafe.Pointer) {
	defer recoverCall("symmem_handle_signal_pad_ptrs_dev", &result, nil)
	return handlePtr("symmem_handle_signal_pad_ptrs_dev", handle, func(h *symm.Handle) (uintptr, error) {
		_, dev := h.SignalPadPtrs()
		return dev, nil
	})
}

//export symmemgo_put_signal
func symmemgo_put_signal(handle uintptr, dst, channel C.int, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_put_signal", &result, C.int(core.ErrInternal))
	h, err := handleOf(handle)
	if err == nil {
		err = h.PutSignal(int(dst), int(channel), streamOf(stream), 0)
	}
	if err == nil { // the hot path: no message to format
		return 0
	}
	return setLastError(fmt.Sprintf("symmem_put_signal(dst_rank=%d, channel=%d)", int(dst), int(channel)), err)
}

//export symmemgo_wait_signal
func symmemgo_wait_signal(handle uintptr, src, channel C.int, timeoutMs C.int64_t, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_wait_signal", &result, C.int(core.ErrInternal))
	h, err := handleOf(handle)
	var timeout time.Duration
	if err == nil {
		timeout, err = timeoutOf(timeoutMs)
	}
	if err == nil {
		err = h.WaitSignal(int(src), int(channel), streamOf(stream), timeout)
	}
	if err == nil {
		return 0
	}
	return setLastError(fmt.Sprintf("symmem_wait_signal(src_rank=%d, channel=%d)", int(src), int(channel)), err)
}

//export symmemgo_barrier
func symmemgo_barrier(handle uintptr, channel C.int, timeoutMs C.int64_t, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_barrier", &result, C.int(core.ErrInternal))
	h, err := handleOf(handle)
	var timeout time.Duration
	if err == nil {
		timeout, err = timeoutOf(timeoutMs)
	}
	if err == nil {
		err = h.Barrier(int(channel), streamOf(stream), timeout)
	}
	if err == nil {
		return 0
	}
	return setLastError(fmt.Sprintf("symmem_barrier(channel=%d)", int(channel)), err)
}

//export symmemgo_handle_device_error
func symmemgo_handle_device_error(handle uintptr, flag *C.uint32_t) (result C.int) {
	defer recoverCall("symmem_handle_device_error", &result, C.int(core.ErrInternal))
	if flag == nil {
		return setLastError("symmem_handle_device_error", core.Errorf(core.ErrInvalidArgument, "flag is NULL"))
	}
	*flag = 0
	h, err := handleOf(handle)
	if err == nil {
		var v uint32
		if v, err = h.DeviceError(); err == nil {
			*flag = C.uint32_t(v)
			if err = h.DeviceErrorText(v); err == nil {
				return 0
			}
		}
	}
	return setLastError("symmem_handle_device_error", err)
}

// cstrcpy copies s into the C buffer dst of n bytes, cut and NUL-terminated.
func cstrcpy(dst *C.char, n int, s string) {
	b := unsafe.Slice((*byte)(unsafe.Pointer(dst)), n)
	k := copy(b[:n-1], s)
	b[k] = 0
}

//export symmemgo_collectives_load
func symmemgo_collectives_load(device C.int, info *C.symmem_kernel_info) (result C.int) {
	defer recoverCall("symmem_collectives_load", &result, C.int(core.ErrInternal))
	call := fmt.Sprintf("symmem_collectives_load(device=%d)", int(device))
	if info != nil {
		*info = C.symmem_kernel_info{}
	}
	rt, err := runtimeOrError()
	if err != nil {
		return setLastError(call, err)
	}
	if d := int(device); d < 0 || d >= rt.Backend.DeviceCount() {
		return setLastError(call, core.Errorf(core.ErrInvalidDevice, "device %d does not exist (%d devices)", d, rt.Backend.DeviceCount()))
	}
	kl, ok := rt.Backend.(core.KernelLoader)
	if !ok {
		return 0
	}
	ki, err := kl.LoadKernels(int(device))
	if err != nil {
		return setLastError(call, err)
	}
	if info != nil {
		info.arch = C.int(ki.Arch)
		if ki.FromCache {
			info.from_cache = 1
		}
		info.compile_ms = C.double(ki.CompileMs)
		info.load_ms = C.double(ki.LoadMs)
		cstrcpy(&info.compiler[0], len(info.compiler), ki.Compiler)
		cstrcpy(&info.cache_path[0], len(info.cache_path), ki.CachePath)
	}
	return 0
}
