package main

// Tags, pause and resume (include/symmem.h, "Tags and pause"): marshalling
// only; the logic is in core/tags.go and core/symm/pause.go.

/*
#include "internal.h"
*/
import "C"

import (
	"sync/atomic"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/symm"
)

// regionFlagBackup is SYMMEM_REGION_BACKUP; regionFlagsKnown every flag.
const (
	regionFlagBackup = 1
	regionFlagsKnown = regionFlagBackup
)

// openRegions counts the regions open on every thread. While it is 0 the
// allocation path does not ask C for the thread's tag.
var openRegions atomic.Int64

// currentTag is the calling thread's innermost open region's tag (0: none).
func currentTag() core.TagID {
	if openRegions.Load() == 0 {
		return 0
	}
	return core.TagID(C.symmemi_region_tag())
}

// goTag turns a C tag (NULL = every tag) into the core's ("" = every tag).
func goTag(tag *C.char) string {
	if tag == nil {
		return ""
	}
	return C.GoString(tag)
}

// describeTag names the call; a tag is quoted by the errors about it
// (core.Quote, once; Note [Bounded messages]), not here.
func describeTag(call string, tag *C.char) string {
	if tag == nil {
		return call + "(tag=NULL)"
	}
	return call
}

//export symmemgo_region_begin
func symmemgo_region_begin(tag *C.char, flags C.uint) (result C.int) {
	defer recoverCall("symmem_region_begin", &result, C.int(core.ErrInternal))
	call := describeTag("symmem_region_begin", tag)
	if tag == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "tag is NULL"))
	}
	if flags&^regionFlagsKnown != 0 {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "unknown flags %#x", uint(flags&^regionFlagsKnown)))
	}
	id, err := core.RegisterTag(C.GoString(tag), flags&regionFlagBackup != 0)
	if err != nil {
		return setLastError(call, err)
	}
	if C.symmemi_region_push(C.int(id)) < 0 {
		return setLastError(call, core.Errorf(core.ErrInvalidState, "this thread has 16 regions open already"))
	}
	openRegions.Add(1)
	return 0
}

//export symmemgo_region_end
func symmemgo_region_end() (result C.int) {
	defer recoverCall("symmem_region_end", &result, C.int(core.ErrInternal))
	if C.symmemi_region_pop() < 0 {
		return setLastError("symmem_region_end", core.Errorf(core.ErrInvalidState, "no region is open on this thread"))
	}
	openRegions.Add(-1)
	return 0
}

// eachAllocator runs f on every device's allocator made so far.
func eachAllocator(f func(a *core.Allocator) error) error {
	rt, err := runtimeOrError()
	if err != nil {
		return err
	}
	for _, a := range rt.Allocators() {
		if err := f(a); err != nil {
			return err
		}
	}
	return nil
}

// forTag runs f on every device's allocator where tag ("" = every tag) is
// in the state f acts on (paused for a resume, live for a pause), so that a
// call after a partial failure on several devices finishes the rest. A tag
// in the other state on every device is the first device's ErrInvalidState.
func forTag(tag string, paused bool, f func(a *core.Allocator) error) error {
	if tag == "" {
		return eachAllocator(f)
	}
	var wrongState error
	did := false
	err := eachAllocator(func(a *core.Allocator) error {
		if _, err := a.TagSegments(tag, paused); err != nil {
			if core.CodeOf(err) == core.ErrInvalidState {
				if wrongState == nil {
					wrongState = err
				}
				return nil
			}
			return err
		}
		did = true
		return f(a)
	})
	if err == nil && !did {
		err = wrongState
	}
	return err
}

// checkTagKnown rejects a tag that no region ever opened, whatever the
// devices (a device that never saw it has nothing to do).
func checkTagKnown(tag string) error {
	if tag == "" {
		return nil
	}
	if err := core.CheckName("tag", tag, core.MaxTagLen); err != nil {
		return err
	}
	if _, ok := core.LookupTag(tag); !ok {
		return core.Errorf(core.ErrInvalidArgument, "tag %q is unknown: no region of it was opened", tag)
	}
	return nil
}

//export symmemgo_pause
func symmemgo_pause(tag *C.char) (result C.int) {
	defer recoverCall("symmem_pause", &result, C.int(core.ErrInternal))
	t := goTag(tag)
	err := checkTagKnown(t)
	if err == nil {
		err = forTag(t, false, func(a *core.Allocator) error {
			_, err := a.Pause(t, core.PauseOptions{})
			return err
		})
	}
	return setLastError(describeTag("symmem_pause", tag), err)
}

//export symmemgo_resume
func symmemgo_resume(tag *C.char) (result C.int) {
	defer recoverCall("symmem_resume", &result, C.int(core.ErrInternal))
	t := goTag(tag)
	err := checkTagKnown(t)
	if err == nil {
		err = forTag(t, true, func(a *core.Allocator) error {
			_, err := a.Resume(t)
			return err
		})
	}
	return setLastError(describeTag("symmem_resume", tag), err)
}

//export symmemgo_pause_group
func symmemgo_pause_group(group uintptr, tag *C.char) (result C.int) {
	defer recoverCall("symmem_pause_group", &result, C.int(core.ErrInternal))
	return groupTagCall("symmem_pause_group", group, tag, (*symm.Group).Pause)
}

//export symmemgo_resume_group
func symmemgo_resume_group(group uintptr, tag *C.char) (result C.int) {
	defer recoverCall("symmem_resume_group", &result, C.int(core.ErrInternal))
	return groupTagCall("symmem_resume_group", group, tag, (*symm.Group).Resume)
}

func groupTagCall(name string, group uintptr, tag *C.char, f func(*symm.Group, string) error) C.int {
	call := describeTag(name, tag)
	g, err := groupOf(group)
	if t := goTag(tag); err == nil && t != "" {
		// A malformed tag fails here, quoted once, before the collective.
		err = core.CheckName("tag", t, core.MaxTagLen)
	}
	if err == nil {
		err = f(g, goTag(tag))
	}
	return setLastError(call, err)
}
