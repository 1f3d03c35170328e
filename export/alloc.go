package main

/*
#include "internal.h"
#include "tcache.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

func streamOf(s *C.struct_CUstream_st) core.Stream { return core.Stream(uintptr(unsafe.Pointer(s))) }

//export symmemgo_alloc
func symmemgo_alloc(size C.size_t, device C.int, stream *C.struct_CUstream_st) (result unsafe.Pointer) {
	defer recoverCall("symmem_alloc", &result, nil)
	a, err := allocatorFor(device)
	if err == nil {
		var p uintptr
		if p, err = a.AllocTagged(uintptr(size), streamOf(stream), currentTag()); err == nil {
			attachContext(a, p)
			return unmanaged.Pointer(p)
		}
	}
	setLastError(fmt.Sprintf("symmem_alloc(size=%d, device=%d)", uint64(size), int(device)), err)
	return nil
}

// symmemgo_free is symmem_free's Go path; tc is the calling thread's bin of
// the device (NULL: none), where the block may go (Note [Thread caches in
// C], tcache.h).
//
//export symmemgo_free
func symmemgo_free(ptr unsafe.Pointer, size C.size_t, device C.int, stream *C.struct_CUstream_st, tc *C.symmemi_tcache) {
	defer recoverVoid("symmem_free")
	if ptr == nil {
		return
	}
	a, err := allocatorFor(device)
	if err == nil {
		if err = a.FreeTo(uintptr(ptr), uintptr(size), streamOf(stream), binOf(tc)); err == nil {
			return
		}
	}
	call := fmt.Sprintf("symmem_free(ptr=%p, size=%d, device=%d)", ptr, uint64(size), int(device))
	setLastError(call, err)
	if strict && core.CodeOf(err) == core.ErrInvalidPointer {
		msg := call + ": " + err.Error()
		C.symmemi_abort(cstr(msg), C.size_t(len(msg)))
	}
}

//export symmemgo_record_stream
func symmemgo_record_stream(ptr unsafe.Pointer, stream *C.struct_CUstream_st) {
	defer recoverVoid("symmem_record_stream")
	rt, err := runtimeOrError()
	if err == nil {
		var a *alloc.Allocator
		if _, a, err = rt.Lookup(uintptr(ptr)); err == nil {
			err = a.RecordStream(uintptr(ptr), streamOf(stream))
		}
	}
	setLastError(fmt.Sprintf("symmem_record_stream(ptr=%p)", ptr), err)
}

//export symmemgo_init
func symmemgo_init(deviceCount C.int) {
	defer recoverVoid("symmem_init")
	_, err := runtimeOrError()
	setLastError("symmem_init", err)
}

//export symmemgo_reset
func symmemgo_reset() {
	defer recoverVoid("symmem_reset")
	symmemgo_empty_cache(-1)
}

//export symmemgo_memory_fraction
func symmemgo_memory_fraction(fraction C.double, device C.int) {
	defer recoverVoid("symmem_memory_fraction")
	call := fmt.Sprintf("symmem_memory_fraction(fraction=%g, device=%d)", float64(fraction), int(device))
	a, err := allocatorFor(device)
	if err != nil {
		setLastError(call, err)
		return
	}
	f := float64(fraction)
	if math.IsNaN(f) || f <= 0 || f > 1 {
		setLastError(call, core.Errorf(core.ErrInvalidArgument, "the fraction must be in (0, 1]"))
		return
	}
	limit := uint64(f * float64(a.TotalMemory()))
	if limit == 0 { // 0 would mean "no limit": the opposite of what was asked
		setLastError(call, core.Errorf(core.ErrInvalidArgument, "the fraction %g of the device's %d bytes rounds to 0 bytes", f, a.TotalMemory()))
		return
	}
	a.SetLimit(limit)
}

// onDevices runs f on device's allocator, or on every device's for -1,
// stopping at the first error, which becomes call's last error.
func onDevices(call string, device C.int, f func(*alloc.Allocator) error) C.int {
	call = describeDevice(call, device)
	if device != -1 {
		a, err := allocatorFor(device)
		if err == nil {
			err = f(a)
		}
		return setLastError(call, err)
	}
	rt, err := runtimeOrError()
	if err != nil {
		return setLastError(call, err)
	}
	for _, a := range rt.Allocators() {
		if err := f(a); err != nil {
			return setLastError(call, err)
		}
	}
	return 0
}

//export symmemgo_empty_cache
func symmemgo_empty_cache(device C.int) (result C.int) {
	defer recoverCall("symmem_empty_cache", &result, C.int(core.ErrInternal))
	return onDevices("symmem_empty_cache", device, (*alloc.Allocator).EmptyCache)
}

//export symmemgo_thread_caches_drain
func symmemgo_thread_caches_drain(device C.int) (result C.int) {
	defer recoverCall("symmem_thread_caches_drain", &result, C.int(core.ErrInternal))
	return onDevices("symmem_thread_caches_drain", device, func(a *alloc.Allocator) error {
		a.DrainThreadCaches()
		return nil
	})
}

//export symmemgo_set_memory_limit
func symmemgo_set_memory_limit(device C.int, bytes C.size_t) (result C.int) {
	defer recoverCall("symmem_set_memory_limit", &result, C.int(core.ErrInternal))
	a, err := allocatorFor(device)
	if err == nil {
		a.SetLimit(uint64(bytes))
	}
	return setLastError(describeDevice("symmem_set_memory_limit", device), err)
}

//export symmemgo_get_memory_limit
func symmemgo_get_memory_limit(device C.int, bytes *C.size_t) (result C.int) {
	defer recoverCall("symmem_get_memory_limit", &result, C.int(core.ErrInternal))
	call := describeDevice("symmem_get_memory_limit", device)
	if bytes == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "bytes is NULL"))
	}
	a, err := allocatorFor(device)
	if err == nil {
		*bytes = C.size_t(a.Limit())
	}
	return setLastError(call, err)
}

// statKeys are the statistics' keys as C strings, made once.
var statKeys = func() []*C.char {
	keys := make([]*C.char, len(alloc.StatKeys))
	for i, k := range alloc.StatKeys {
		keys[i] = keptCString(k)
	}
	return keys
}()

//export symmemgo_stats
func symmemgo_stats(device C.int, out *C.symmem_stat, capacity C.size_t) (result C.size_t) {
	defer recoverCall("symmem_stats", &result, 0)
	a, err := allocatorFor(device)
	if err != nil {
		setLastError(describeDevice("symmem_stats", device), err)
		return 0
	}
	// As many values as there are keys (no fixed-size copy: the table grows
	// with the statistics); at most capacity of them are copied out.
	values := make([]int64, len(statKeys))
	n := a.StatValues(values)
	if n > len(statKeys) { // a key was added without its C string: a bug
		setLastError(describeDevice("symmem_stats", device), core.Errorf(core.ErrInternal, "%d statistics but %d keys", n, len(statKeys)))
		return 0
	}
	if out != nil && capacity > 0 {
		dst := unsafe.Slice(out, int(min(capacity, C.size_t(n))))
		for i := range dst {
			dst[i].key = statKeys[i]
			dst[i].value = C.int64_t(values[i])
		}
	}
	return C.size_t(n)
}

//export symmemgo_reset_peak_stats
func symmemgo_reset_peak_stats(device C.int) (result C.int) {
	defer recoverCall("symmem_reset_peak_stats", &result, C.int(core.ErrInternal))
	a, err := allocatorFor(device)
	if err == nil {
		a.ResetPeakStats()
	}
	return setLastError(describeDevice("symmem_reset_peak_stats", device), err)
}

//export symmemgo_pointer_get_info
func symmemgo_pointer_get_info(ptr unsafe.Pointer, info *C.symmem_pointer_info) (result C.int) {
	defer recoverCall("symmem_pointer_get_info", &result, C.int(core.ErrInternal))
	call := fmt.Sprintf("symmem_pointer_get_info(ptr=%p)", ptr)
	if info == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "info is NULL"))
	}
	rt, err := runtimeOrError()
	if err != nil {
		return setLastError(call, err)
	}
	b, _, err := rt.Lookup(uintptr(ptr))
	if err != nil {
		return setLastError(call, err)
	}
	*info = C.symmem_pointer_info{
		block:          unmanaged.Pointer(b.Addr),
		block_size:     C.size_t(b.Size),
		requested_size: C.size_t(b.Requested),
		offset:         C.size_t(uintptr(ptr) - b.Addr),
		heap_offset:    C.uint64_t(b.HeapOff),
		device:         C.int(b.Device),
	}
	return 0
}

//export symmemgo_validate
func symmemgo_validate(device C.int) (result C.int) {
	defer recoverCall("symmem_validate", &result, C.int(core.ErrInternal))
	a, err := allocatorFor(device)
	if err == nil {
		err = a.Validate()
	}
	return setLastError(describeDevice("symmem_validate", device), err)
}

//export symmemgo_copy
func symmemgo_copy(dst, src unsafe.Pointer, n C.size_t, device C.int, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_copy", &result, C.int(core.ErrInternal))
	call := fmt.Sprintf("symmem_copy(dst=%p, src=%p, n=%d, device=%d)", dst, src, uint64(n), int(device))
	if n == 0 {
		return 0
	}
	if dst == nil || src == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "dst and src must not be NULL"))
	}
	a, err := allocatorFor(device)
	if err == nil {
		err = checkRanges(uintptr(n), uintptr(dst), "dst", uintptr(src), "src")
	}
	if err == nil {
		err = a.Backend().Copy(int(device), streamOf(stream), uintptr(dst), uintptr(src), uintptr(n))
	}
	return setLastError(call, err)
}

//export symmemgo_memset
func symmemgo_memset(dst unsafe.Pointer, value C.int, n C.size_t, device C.int, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_memset", &result, C.int(core.ErrInternal))
	call := fmt.Sprintf("symmem_memset(dst=%p, value=%d, n=%d, device=%d)", dst, int(value), uint64(n), int(device))
	if n == 0 {
		return 0
	}
	if dst == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "dst must not be NULL"))
	}
	a, err := allocatorFor(device)
	if err == nil {
		err = checkRanges(uintptr(n), uintptr(dst), "dst")
	}
	if err == nil {
		err = a.Backend().Memset(int(device), streamOf(stream), uintptr(dst), byte(value), uintptr(n))
	}
	return setLastError(call, err)
}

// checkRanges checks n bytes at each pointer (ptr, name pairs) that the
// library knows against the bounds of what it points into (Note [Wild
// pointers] in core).
func checkRanges(n uintptr, ptrsAndNames ...any) error {
	rt, err := runtimeOrError()
	if err != nil {
		return err
	}
	for i := 0; i+1 < len(ptrsAndNames); i += 2 {
		if _, err := rt.CheckRange(ptrsAndNames[i].(uintptr), n, ptrsAndNames[i+1].(string)); err != nil {
			return err
		}
	}
	return nil
}
