package main

/*
#include "internal.h"

static uint64_t symmemi_call_context_hook(symmem_context_fn fn, void *user) { return fn(user); }
*/
import "C"

import (
	"encoding/json"
	"sync"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
)

// contextHook is the function symmem_set_context_hook installed; it is
// asked for a context number after each allocation while recording is on.
var (
	hookMu   sync.RWMutex
	hookFn   C.symmem_context_fn
	hookUser unsafe.Pointer
)

//export symmemgo_set_context_hook
func symmemgo_set_context_hook(fn C.symmem_context_fn, user unsafe.Pointer) (result C.symmem_result) {
	defer recoverCall("symmem_set_context_hook", &result, C.SYMMEM_ERROR_INTERNAL)
	hookMu.Lock()
	hookFn, hookUser = fn, user
	hookMu.Unlock()
	return 0
}

// attachContext asks the hook for the context of the allocation at p (only
// while recording) and gives it to the block.
func attachContext(a *alloc.Allocator, p uintptr) {
	if !alloc.HistoryOn() {
		return
	}
	hookMu.RLock()
	fn, user := hookFn, hookUser
	hookMu.RUnlock()
	if fn == nil {
		return
	}
	ctx := uint64(C.symmemi_call_context_hook(fn, user))
	if ctx != 0 {
		a.AttachContext(p, ctx)
	}
}

//export symmemgo_record_history
func symmemgo_record_history(maxEntries C.size_t) (result C.symmem_result) {
	defer recoverCall("symmem_record_history", &result, C.SYMMEM_ERROR_INTERNAL)
	rt, err := runtimeOrError()
	if err != nil {
		return C.symmem_result(setLastError("symmem_record_history", err))
	}
	n := int(maxEntries)
	if maxEntries > 1<<26 {
		return C.symmem_result(setLastError("symmem_record_history", core.Errorf(core.ErrInvalidArgument, "max_entries %d is above the limit of %d", uint64(maxEntries), 1<<26)))
	}
	rt.SetHistory(n)
	return 0
}

type snapBlock struct {
	Address       uintptr `json:"address"`
	Size          uintptr `json:"size"`
	RequestedSize uintptr `json:"requested_size"`
	State         string  `json:"state"`
	Context       uint64  `json:"context"`
}

type snapSegment struct {
	Device        int         `json:"device"`
	Address       uintptr     `json:"address"`
	TotalSize     uintptr     `json:"total_size"`
	AllocatedSize uintptr     `json:"allocated_size"`
	ActiveSize    uintptr     `json:"active_size"`
	RequestedSize uintptr     `json:"requested_size"`
	Stream        uintptr     `json:"stream"`
	SegmentType   string      `json:"segment_type"`
	Blocks        []snapBlock `json:"blocks"`
}

type snapEvent struct {
	Action  string  `json:"action"`
	Addr    uintptr `json:"addr"`
	Size    uintptr `json:"size"`
	Stream  uintptr `json:"stream"`
	TimeUs  int64   `json:"time_us"`
	Context uint64  `json:"context"`
}

type snapshotDoc struct {
	Segments     []snapSegment `json:"segments"`
	DeviceTraces [][]snapEvent `json:"device_traces"`
	Recording    bool          `json:"recording"`
}

func buildSnapshot() (snapshotDoc, error) {
	doc := snapshotDoc{Segments: []snapSegment{}, DeviceTraces: [][]snapEvent{}, Recording: alloc.HistoryOn()}
	rt, err := runtimeOrError()
	if err != nil {
		return doc, err
	}
	n := rt.Backend.DeviceCount()
	doc.DeviceTraces = make([][]snapEvent, n)
	for i := range doc.DeviceTraces {
		doc.DeviceTraces[i] = []snapEvent{}
	}
	for _, a := range rt.Allocators() {
		segs, evs := a.Snapshot()
		for _, s := range segs {
			out := snapSegment{Device: s.Device, Address: s.Addr, TotalSize: s.Size, AllocatedSize: s.Allocated,
				ActiveSize: s.Allocated, RequestedSize: s.Requested, Stream: uintptr(s.Stream), SegmentType: "large"}
			if s.Small {
				out.SegmentType = "small"
			}
			for _, b := range s.Blocks {
				st := "inactive"
				if b.Allocated {
					st = "active_allocated"
				}
				out.Blocks = append(out.Blocks, snapBlock{Address: b.Addr, Size: b.Size, RequestedSize: b.Requested, State: st, Context: b.Context})
			}
			doc.Segments = append(doc.Segments, out)
		}
		for _, e := range evs {
			doc.DeviceTraces[a.Device()] = append(doc.DeviceTraces[a.Device()],
				snapEvent{Action: e.Action, Addr: e.Addr, Size: e.Size, Stream: uintptr(e.Stream), TimeUs: e.TimeUs, Context: e.Context})
		}
	}
	return doc, nil
}

//export symmemgo_memory_snapshot_json
func symmemgo_memory_snapshot_json(buf *C.char, length C.size_t) (result C.size_t) {
	defer recoverCall("symmem_memory_snapshot_json", &result, 0)
	doc, err := buildSnapshot()
	if err != nil {
		setLastError("symmem_memory_snapshot_json", err)
		return 0
	}
	b, err := json.Marshal(doc)
	if err != nil {
		setLastError("symmem_memory_snapshot_json", core.Errorf(core.ErrInternal, "%v", err))
		return 0
	}
	return copyOut(b, buf, length)
}

// copyOut writes b into buf (capacity length, NUL-terminated, truncated if
// needed) and returns len(b), as snprintf does.
func copyOut(b []byte, buf *C.char, length C.size_t) C.size_t {
	if buf != nil && length > 0 {
		n := len(b)
		if n > int(length)-1 {
			n = int(length) - 1
		}
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(length))
		copy(dst, b[:n])
		dst[n] = 0
	}
	return C.size_t(len(b))
}
