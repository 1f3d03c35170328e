package main

// The NCCL section of include/symmem.h: marshalling only; the logic is in
// core/symm (Note [NCCL groups]) and cuda/nccl.go.

/*
#include "internal.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/ipc"
	"github.com/libsymmem/libsymmem/core/symm"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"github.com/libsymmem/libsymmem/cuda"
)

// symmemNCCLNoWindows is SYMMEM_NCCL_NO_WINDOWS of symmem.h.
const symmemNCCLNoWindows = 1

//export symmemgo_group_create_nccl
func symmemgo_group_create_nccl(comm unsafe.Pointer, name *C.char, timeoutMs C.int64_t, flags C.uint, out *uintptr) (result C.int) {
	defer recoverCall("symmem_group_create_nccl", &result, C.int(core.ErrInternal))
	n := "" // a name is quoted by the errors about it (groupCall)
	if name == nil {
		n = "name=NULL, "
	}
	call := fmt.Sprintf("symmem_group_create_nccl(comm=%p, %sflags=%#x)", comm, n, uint(flags))
	if out == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "out is NULL"))
	}
	*out = 0
	if name == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "name is NULL"))
	}
	if flags&^symmemNCCLNoWindows != 0 {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "unknown flags %#x", uint(flags)))
	}
	if err := ipc.ValidateName(C.GoString(name)); err != nil { // before NCCL loads
		return setLastError(call, err)
	}
	timeout, err := timeoutOf(timeoutMs)
	if err != nil {
		return setLastError(call, err)
	}
	rt, err := runtimeOrError()
	if err != nil {
		return setLastError(call, err)
	}
	c, err := cuda.OpenNCCLComm(uintptr(comm))
	if err != nil {
		return setLastError(call, err)
	}
	g, err := symm.New(symm.Options{Name: C.GoString(name), Comm: c, NoWindows: flags&symmemNCCLNoWindows != 0,
		Timeout: timeout, Runtime: rt})
	if err != nil {
		return setLastError(call, err)
	}
	*out = register(objGroup, g)
	return 0
}

//export symmemgo_nccl_version
func symmemgo_nccl_version() (result C.int) {
	defer recoverCall("symmem_nccl_version", &result, 0)
	info, err := cuda.LoadNCCL()
	if err != nil {
		setLastError("symmem_nccl_version", err)
		return 0
	}
	return C.int(info.Version)
}

//export symmemgo_handle_nccl_window
func symmemgo_handle_nccl_window(handle uintptr, window *unsafe.Pointer, offset *C.size_t) (result C.int) {
	defer recoverCall("symmem_handle_nccl_window", &result, C.int(core.ErrInternal))
	const call = "symmem_handle_nccl_window"
	h, err := handleOf(handle)
	if err != nil {
		return setLastError(call, err)
	}
	if window == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "window is NULL"))
	}
	w, off, err := h.Window()
	if err != nil {
		*window = nil
		return setLastError(call, err)
	}
	if w == 0 {
		*window = nil
		return setLastError(call, core.Errorf(core.ErrUnavailable, "the handle of group %q has no NCCL window: the group is not over an NCCL communicator, or was created with SYMMEM_NCCL_NO_WINDOWS", h.GroupName()))
	}
	*window = unmanaged.Pointer(w)
	if offset != nil {
		*offset = C.size_t(off)
	}
	return 0
}

//export symmemgo_group_nccl_window_counts
func symmemgo_group_nccl_window_counts(group uintptr, registered, deregistered, live *C.int64_t) (result C.int) {
	defer recoverCall("symmem_group_nccl_window_counts", &result, C.int(core.ErrInternal))
	const call = "symmem_group_nccl_window_counts"
	g, err := groupOf(group)
	if err != nil {
		return setLastError(call, err)
	}
	r, d, l := g.WindowCounts()
	for _, p := range []struct {
		dst *C.int64_t
		v   int
	}{{registered, r}, {deregistered, d}, {live, l}} {
		if p.dst != nil {
			*p.dst = C.int64_t(p.v)
		}
	}
	return 0
}
