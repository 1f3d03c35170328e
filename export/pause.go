package main

// Tags, pause and resume (include/symmem.h, "Tags and pause"): marshalling
// only; the logic is in core/alloc (tags.go, pause.go, backup.go) and
// core/symm/pause.go.

/*
#include "internal.h"
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/symm"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// The region flags (SYMMEM_REGION_BACKUP, SYMMEM_REGION_BACKUP_PAGEABLE,
// SYMMEM_REGION_UNTAGGED, SYMMEM_REGION_BACKUP_DISK,
// SYMMEM_REGION_OWN_DEVICE) and the pause flags (SYMMEM_PAUSE_DISCARD,
// SYMMEM_PAUSE_KEEP).
const (
	regionFlagBackup    = 1
	regionFlagPageable  = 2
	regionFlagUntagged  = 4
	regionFlagDisk      = 8
	regionFlagOwnDevice = 16
	regionFlagsKnown    = regionFlagBackup | regionFlagPageable | regionFlagDisk | regionFlagOwnDevice

	pauseFlagDiscard = 1
	pauseFlagKeep    = 2
	pauseFlagsKnown  = pauseFlagDiscard | pauseFlagKeep
)

// backupKindOf reads the region flags' backup kind.
func backupKindOf(flags C.uint) (alloc.BackupKind, error) {
	if flags&^regionFlagsKnown != 0 {
		return 0, core.Errorf(core.ErrInvalidArgument, "unknown flags %#x", uint(flags&^regionFlagsKnown))
	}
	switch {
	case flags&(regionFlagPageable|regionFlagDisk) != 0 && flags&regionFlagBackup == 0:
		return 0, core.Errorf(core.ErrInvalidArgument, "SYMMEM_REGION_BACKUP_PAGEABLE and SYMMEM_REGION_BACKUP_DISK need SYMMEM_REGION_BACKUP")
	case flags&regionFlagPageable != 0 && flags&regionFlagDisk != 0:
		return 0, core.Errorf(core.ErrInvalidArgument, "SYMMEM_REGION_BACKUP_PAGEABLE and SYMMEM_REGION_BACKUP_DISK exclude each other")
	case flags&regionFlagDisk != 0:
		return alloc.BackupDisk, nil
	case flags&regionFlagPageable != 0:
		return alloc.BackupPageable, nil
	case flags&regionFlagBackup != 0:
		return alloc.BackupPinned, nil
	}
	return alloc.BackupNone, nil
}

// registerTag registers tag (not NULL) with the backup kind of the region
// flags: what symmem_region_begin and symmem_set_default_tag take.
func registerTag(tag *C.char, flags C.uint) (alloc.TagID, error) {
	kind, err := backupKindOf(flags)
	if err != nil {
		return 0, err
	}
	return alloc.RegisterTagWith(C.GoString(tag), alloc.TagOptions{Backup: kind, OwnDevice: flags&regionFlagOwnDevice != 0})
}

// pauseBackupOf reads the pause flags.
func pauseBackupOf(flags C.uint) (alloc.PauseBackup, error) {
	switch {
	case flags&^pauseFlagsKnown != 0:
		return 0, core.Errorf(core.ErrInvalidArgument, "unknown flags %#x", uint(flags&^pauseFlagsKnown))
	case flags == pauseFlagsKnown:
		return 0, core.Errorf(core.ErrInvalidArgument, "SYMMEM_PAUSE_DISCARD and SYMMEM_PAUSE_KEEP exclude each other")
	case flags&pauseFlagDiscard != 0:
		return alloc.PauseDiscard, nil
	case flags&pauseFlagKeep != 0:
		return alloc.PauseKeep, nil
	}
	return alloc.PauseBackupAsTag, nil
}

// openRegions counts the regions open on every thread. While it is 0 the
// allocation path does not ask C for the thread's tag.
var openRegions atomic.Int64

// defaultTag is the tag of allocations made outside every region
// (symmem_set_default_tag; 0: untagged). pause.c keeps a copy for C.
var defaultTag atomic.Int32

// currentTag is the tag of the calling thread's allocations: its innermost
// open region's (0 for an untagged region), else the default tag.
func currentTag() alloc.TagID {
	if openRegions.Load() == 0 {
		return alloc.TagID(defaultTag.Load())
	}
	t := C.symmemi_region_tag()
	if t < 0 {
		return alloc.TagID(defaultTag.Load())
	}
	return alloc.TagID(t)
}

// goTag turns a C tag (NULL = every tag) into the core's ("" = every tag).
// An empty C string is not "every tag": an unset string in a caller's
// configuration must not pause (and, without backup, zero) every tag, so it
// is ErrInvalidArgument, as any tag outside 1..64 characters.
func goTag(tag *C.char) (string, error) {
	if tag == nil {
		return "", nil
	}
	t := C.GoString(tag)
	if t == "" {
		return "", core.Errorf(core.ErrInvalidArgument, "the tag is the empty string: tags have 1 to %d characters; pass NULL for every tag", alloc.MaxTagLen)
	}
	return t, nil
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
	var id alloc.TagID
	switch {
	case flags == regionFlagUntagged && tag == nil:
		// An untagged region: id 0.
	case flags&regionFlagUntagged != 0:
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "SYMMEM_REGION_UNTAGGED takes a NULL tag and no other flag"))
	case tag == nil:
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "tag is NULL"))
	default:
		var err error
		if id, err = registerTag(tag, flags); err != nil {
			return setLastError(call, err)
		}
	}
	if C.symmemi_region_push(C.int(id)) < 0 {
		return setLastError(call, core.Errorf(core.ErrInvalidState, "this thread has 16 regions open already"))
	}
	openRegions.Add(1)
	return 0
}

//export symmemgo_set_default_tag
func symmemgo_set_default_tag(tag *C.char, flags C.uint) (result C.int) {
	defer recoverCall("symmem_set_default_tag", &result, C.int(core.ErrInternal))
	call := describeTag("symmem_set_default_tag", tag)
	var id alloc.TagID
	if tag != nil {
		var err error
		if id, err = registerTag(tag, flags); err != nil {
			return setLastError(call, err)
		}
	} else if flags != 0 {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "flags %#x with a NULL tag (no default tag)", uint(flags)))
	}
	defaultTag.Store(int32(id))
	C.symmemi_set_default_tag(C.int(id))
	return 0
}

//export symmemgo_set_backup_dir
func symmemgo_set_backup_dir(path *C.char) (result C.int) {
	defer recoverCall("symmem_set_backup_dir", &result, C.int(core.ErrInternal))
	dir := ""
	if path != nil {
		dir = C.GoString(path)
		if dir == "" {
			return setLastError("symmem_set_backup_dir", core.Errorf(core.ErrInvalidArgument, "the path is the empty string (NULL goes back to the default)"))
		}
	}
	return setLastError("symmem_set_backup_dir", alloc.SetBackupDir(dir))
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

// withRuntime runs f on the process's runtime, or fails as the runtime
// does.
func withRuntime(f func(rt *alloc.Runtime) error) error {
	rt, err := runtimeOrError()
	if err != nil {
		return err
	}
	return f(rt)
}

// eachAllocator runs f on every device's allocator made so far.
func eachAllocator(f func(a *alloc.Allocator) error) error {
	return withRuntime(func(rt *alloc.Runtime) error {
		for _, a := range rt.Allocators() {
			if err := f(a); err != nil {
				return err
			}
		}
		return nil
	})
}

// checkTagKnown rejects a tag that no region ever opened, whatever the
// devices (a device that never saw it has nothing to do).
func checkTagKnown(tag string) error {
	if tag == "" {
		return nil
	}
	_, err := alloc.KnownTag(tag)
	return err
}

//export symmemgo_pause
func symmemgo_pause(tag *C.char) (result C.int) {
	defer recoverCall("symmem_pause", &result, C.int(core.ErrInternal))
	return pauseTag("symmem_pause", tag, 0)
}

//export symmemgo_pause_with
func symmemgo_pause_with(tag *C.char, flags C.uint) (result C.int) {
	defer recoverCall("symmem_pause_with", &result, C.int(core.ErrInternal))
	return pauseTag("symmem_pause_with", tag, flags)
}

func pauseTag(call string, tag *C.char, flags C.uint) C.int {
	t, err := goTag(tag)
	var backup alloc.PauseBackup
	if err == nil {
		backup, err = pauseBackupOf(flags)
	}
	var c alloc.TagChoice
	if err == nil {
		c, err = alloc.ChooseTag(t)
	}
	if err == nil {
		err = withRuntime(func(rt *alloc.Runtime) error { return rt.PauseTag(c, alloc.PauseOptions{Backup: backup}) })
	}
	return setLastError(describeTag(call, tag), err)
}

//export symmemgo_tag_bytes
func symmemgo_tag_bytes(tag *C.char, live, paused *C.size_t) (result C.int) {
	defer recoverCall("symmem_tag_bytes", &result, C.int(core.ErrInternal))
	call := describeTag("symmem_tag_bytes", tag)
	if tag == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "tag is NULL"))
	}
	t, err := goTag(tag)
	var sumLive, sumPaused uint64
	if err == nil {
		err = checkTagKnown(t)
	}
	if err == nil {
		err = eachAllocator(func(a *alloc.Allocator) error {
			l, p, err := a.TagBytes(t)
			sumLive += l
			sumPaused += p
			return err
		})
	}
	if err == nil {
		if live != nil {
			*live = C.size_t(sumLive)
		}
		if paused != nil {
			*paused = C.size_t(sumPaused)
		}
	}
	return setLastError(call, err)
}

//export symmemgo_backup_pointer
func symmemgo_backup_pointer(ptr unsafe.Pointer, size C.size_t, host *unsafe.Pointer, paused *C.int) (result C.int) {
	defer recoverCall("symmem_backup_pointer", &result, C.int(core.ErrInternal))
	call := fmt.Sprintf("symmem_backup_pointer(%p, %d)", ptr, uint64(size))
	if host == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidArgument, "host is NULL"))
	}
	*host = nil
	if ptr == nil {
		return setLastError(call, core.Errorf(core.ErrInvalidPointer, "ptr is NULL"))
	}
	var found error = core.Errorf(core.ErrInvalidPointer, "%p was not allocated by libsymmem", ptr)
	err := eachAllocator(func(a *alloc.Allocator) error {
		addr, isPaused, err := a.BackupOf(uintptr(ptr), uintptr(size))
		if core.CodeOf(err) == core.ErrInvalidPointer {
			return nil
		}
		found = err
		if err == nil {
			*host = unmanaged.Pointer(addr)
		}
		if paused != nil {
			*paused = 0
			if isPaused {
				*paused = 1
			}
		}
		return nil
	})
	if err == nil {
		err = found
	}
	return setLastError(call, err)
}

//export symmemgo_resume
func symmemgo_resume(tag *C.char) (result C.int) {
	defer recoverCall("symmem_resume", &result, C.int(core.ErrInternal))
	return resumeTag("symmem_resume", tag, 0)
}

//export symmemgo_resume_with
func symmemgo_resume_with(tag *C.char, flags C.uint) (result C.int) {
	defer recoverCall("symmem_resume_with", &result, C.int(core.ErrInternal))
	return resumeTag("symmem_resume_with", tag, flags)
}

// The resume flags: SYMMEM_RESUME_NO_FILL, SYMMEM_RESUME_RELEASE_BACKUP,
// SYMMEM_RESUME_RETAIN_BACKUP.
const (
	resumeFlagNoFill  = 1
	resumeFlagRelease = 2
	resumeFlagRetain  = 4
	resumeFlagsKnown  = resumeFlagNoFill | resumeFlagRelease | resumeFlagRetain
)

// resumeOptionsOf reads the resume flags.
func resumeOptionsOf(flags C.uint) (alloc.ResumeOptions, error) {
	o := alloc.ResumeOptions{NoFill: flags&resumeFlagNoFill != 0}
	switch {
	case flags&^resumeFlagsKnown != 0:
		return o, core.Errorf(core.ErrInvalidArgument, "unknown flags %#x", uint(flags&^resumeFlagsKnown))
	case flags&resumeFlagRelease != 0 && flags&resumeFlagRetain != 0:
		return o, core.Errorf(core.ErrInvalidArgument, "SYMMEM_RESUME_RELEASE_BACKUP and SYMMEM_RESUME_RETAIN_BACKUP exclude each other")
	case flags&resumeFlagRelease != 0:
		o.Backup = alloc.ResumeReleaseBackup
	case flags&resumeFlagRetain != 0:
		o.Backup = alloc.ResumeRetainBackup
	}
	return o, nil
}

func resumeTag(call string, tag *C.char, flags C.uint) C.int {
	t, err := goTag(tag)
	var o alloc.ResumeOptions
	if err == nil {
		o, err = resumeOptionsOf(flags)
	}
	var c alloc.TagChoice
	if err == nil {
		c, err = alloc.ChooseTag(t)
	}
	if err == nil {
		err = withRuntime(func(rt *alloc.Runtime) error { return rt.ResumeTag(c, o) })
	}
	return setLastError(describeTag(call, tag), err)
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
	t, err := goTag(tag)
	var g *symm.Group
	if err == nil && t != "" {
		// A malformed tag fails here, quoted once, before the collective.
		err = core.CheckName("tag", t, alloc.MaxTagLen)
	}
	if err == nil {
		g, err = groupOf(group)
	}
	if err == nil {
		err = f(g, t)
	}
	return setLastError(call, err)
}
