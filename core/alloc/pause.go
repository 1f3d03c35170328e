package alloc

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
)

// PauseOptions modify Pause.
type PauseOptions struct {
	// Collective: the caller (symm.Group.Pause) drops the peers' imports
	// of exported segments itself, so they may be paused.
	Collective bool
	// Backup overrides, for this pause only, what the tag keeps.
	Backup PauseBackup
	// Stage splits a collective pause (symm's Note [Collective pause]):
	// PausePrepare waits for the device and makes the host copies, and
	// releases nothing; PauseCommit then releases, keeping those copies.
	Stage PauseStage
}

// PauseStage is what part of a pause to run (PauseOptions.Stage).
type PauseStage uint8

const (
	PauseWhole PauseStage = iota
	PausePrepare
	PauseCommit
)

// PauseBackup chooses what one pause keeps of a tag's contents.
type PauseBackup uint8

const (
	// PauseBackupAsTag: what the tag's regions asked for.
	PauseBackupAsTag PauseBackup = iota
	// PauseDiscard: no host copy, even for a tag with backup; the resume
	// zero-fills (vLLM's sleep of a tag it does not offload).
	PauseDiscard
	// PauseKeep: a host copy even for a tag without backup, pinned where
	// the backend has it (a tag with backup keeps the kind it asked for).
	PauseKeep
)

// backupFor is the kind of host copy a pause with option o makes of seg.
func backupFor(seg *segment, o PauseBackup) BackupKind {
	switch o {
	case PauseDiscard:
		return BackupNone
	case PauseKeep:
		if seg.pools.tag.backup == BackupNone {
			return BackupPinned
		}
	}
	return seg.pools.tag.backup
}

// Pause releases the physical memory of tag ("" = every live tag used on
// this device) as Note [Tags and pause] says, and returns the bytes released.
// A named tag that is already paused is ErrInvalidState; an unknown one
// ErrInvalidArgument. If waiting for the device or making the backup fails,
// nothing is unmapped; a failure while releasing (a release hook, an unmap
// or a release) leaves the tag paused, in part, as Note [Releasing a
// paused tag] says, and Resume takes it back.
func (a *Allocator) Pause(tag string, o PauseOptions) (uint64, error) {
	c, err := ChooseTag(tag)
	if err != nil {
		return 0, err
	}
	return a.PauseChosen(c, o)
}

// PauseChosen is Pause of a tag already resolved.
func (a *Allocator) PauseChosen(c TagChoice, o PauseOptions) (uint64, error) {
	a.lock()
	defer a.mu.Unlock()
	tags, err := a.tagsToChange(c, false)
	if err != nil {
		return 0, err
	}
	return a.pauseLocked(c.name, tags, o)
}

// pauseLocked pauses tags, the tags that a pause of tag acts on (a.mu
// held).
func (a *Allocator) pauseLocked(tag string, tags []*tagState, o PauseOptions) (uint64, error) {
	segs := a.segmentsOf(tags)
	if !o.Collective {
		for _, seg := range segs {
			if seg.exported {
				return 0, core.Errorf(core.ErrInvalidState, "tag %q on device %d: its segment at heap offset %#x was rendezvoused with other processes; pause it with symmem_pause_group on that group", seg.pools.tag.name, a.device, seg.heapOff)
			}
		}
	}
	if o.Stage == PauseCommit { // the prepare waited and made the copies
		return a.releasePaused(tags, segs, tag)
	}
	// Nothing may be unmapped while the device may use it (DESIGN
	// invariant 4); the backup reads memory the device may be writing.
	a.st.numSyncAll++
	if err := a.be.SynchronizeDevice(a.device); err != nil {
		return 0, core.Errorf(core.CodeOf(err), "pausing tag %q on device %d: waiting for the device's work failed, nothing was released: %v", tag, a.device, err)
	}
	var copies []core.FillOrCopy
	var copied []*segment
	for _, seg := range segs {
		// A segment's host copy holds what this pause saved once the copy
		// below has succeeded; a discarded segment's holds nothing.
		seg.backupValid = false
		kind := backupFor(seg, o.Backup)
		if kind == BackupNone || seg.nAllocated == 0 {
			// Nothing allocated: nothing anyone may read after the resume.
			continue
		}
		if err := a.ensureBackup(seg, kind); err != nil {
			return 0, core.Errorf(core.CodeOf(err), "pausing tag %q on device %d: a host backup of %d bytes: %v; nothing was released", seg.pools.tag.name, a.device, seg.size, err)
		}
		copies = append(copies, core.FillOrCopy{Dst: seg.backup, Src: seg.addr, Size: seg.size})
		copied = append(copied, seg)
	}
	if err := a.fillOrCopy(copies); err != nil {
		return 0, core.Errorf(core.CodeOf(err), "pausing tag %q on device %d: copying %d segments to the host: %v; nothing was released", tag, a.device, len(copies), err)
	}
	for _, seg := range copied {
		if seg.backupFile != nil {
			if err := spillBackup(seg); err != nil {
				return 0, core.Errorf(core.CodeOf(err), "pausing tag %q on device %d: the segment at %#x: %v; nothing was released", seg.pools.tag.name, a.device, seg.addr, err)
			}
		}
		seg.backupValid = true
	}
	if o.Stage == PausePrepare {
		return 0, nil
	}
	return a.releasePaused(tags, segs, tag)
}

// Note [Releasing a paused tag]
//
// The release step of a pause (releasePaused) takes the tag's segments one
// at a time, in heap order, and for each runs the release hooks (what
// others registered on it: NCCL windows), unmaps it and releases its
// memory, in that order, before it touches the next. The hooks run
// immediately before their own segment's unmap, never all of them before
// the first unmap, so that a failure stops the step with every segment
// after the failing one still mapped and still holding what was
// registered on it. What a failure at segment k leaves:
//
//	a hook fails     k and the segments after it are mapped, their
//	                 registrations kept (a hook that fails keeps its own;
//	                 others that ran for k are undone).
//	the unmap fails  k is mapped, but its hooks have run: what they undid
//	                 stays undone until a resume. The segments after it
//	                 are mapped with their registrations.
//	the release      k is unmapped, its memory leaked; it counts as
//	fails            paused.
//
// In each case the segments before k are paused, and the tag is paused
// (tagState's rule): Resume takes back the paused segments and leaves the
// mapped ones as they are, so a resume after any of these failures gives a
// tag with every segment live. A second Pause is ErrInvalidState (the tag
// is paused) and says that the tag is paused only in part.

// releasePaused is the end of Pause: it marks tags paused and releases
// segs one by one (Note [Releasing a paused tag]; a.mu held).
func (a *Allocator) releasePaused(tags []*tagState, segs []*segment, tag string) (uint64, error) {
	for _, t := range tags {
		t.paused = true
	}
	var released uint64
	for i, seg := range segs {
		rest := len(segs) - i - 1
		if err := a.runReleaseHooks(seg, true); err != nil {
			return released, core.Errorf(core.CodeOf(err), "pausing tag %q on device %d: the segment at %#x: %v; it and the %d segment(s) after it stay mapped, with what was registered on them (%d segment(s) released before it are paused; the tag counts as paused, and resume takes them back)", seg.pools.tag.name, a.device, seg.addr, err, rest, i)
		}
		if err := a.be.Unmap(a.device, seg.addr, seg.size); err != nil {
			return released, core.Errorf(core.CodeOf(err), "pausing tag %q on device %d: unmapping the segment at %#x: %v; it stays mapped, but what its release hooks undid (an NCCL window) stays undone until a resume; the %d segment(s) after it stay mapped with what was registered on them (%d segment(s) released before it are paused; the tag counts as paused, and resume takes them back)", seg.pools.tag.name, a.device, seg.addr, err, rest, i)
		}
		if err := a.be.Release(seg.mem); err != nil {
			// Unmapped but not released: mark it paused anyway (the
			// handle is lost to us), so that nothing uses it again.
			err = core.Errorf(core.CodeOf(err), "pausing tag %q on device %d: the segment at %#x was unmapped but its physical memory could not be released (leaked; the segment counts as paused): %v; the %d segment(s) after it stay mapped with what was registered on them (the tag counts as paused, and resume takes back its paused segments)", seg.pools.tag.name, a.device, seg.addr, err, rest)
			a.markPaused(seg)
			return released + uint64(seg.size), err
		}
		a.markPaused(seg)
		released += uint64(seg.size)
	}
	return released, nil
}

func (a *Allocator) markPaused(seg *segment) {
	seg.paused = true
	seg.mem = 0
	a.st.add(statReservedBytes, seg.small, -int64(seg.size))
	a.st.add(statPausedBytes, seg.small, int64(seg.size))
}

// Resume takes back the memory of tag ("" = every paused tag used here) at
// the same addresses and restores its backup (zero without one). It returns
// the bytes mapped. A named tag that is not paused is ErrInvalidState. When
// memory runs out (backend or memory limit), it undoes what it mapped and
// returns ErrOutOfMemory naming the tag and the bytes; the tag stays paused
// and Resume may be called again.
func (a *Allocator) Resume(tag string) (uint64, error) {
	return a.ResumeWith(tag, ResumeOptions{})
}

// ResumeOptions modify Resume.
type ResumeOptions struct {
	// NoFill leaves segments without a host copy as the backend gives
	// the new memory (undefined contents) instead of zero-filling them:
	// a zero-fill costs a pass over the memory at device bandwidth (about
	// 1 ms for 4 GiB on an H200), which callers that overwrite the memory
	// anyway need not pay.
	NoFill bool
	// Backup says what becomes of the host copies the resume restored.
	Backup ResumeBackup
}

// ResumeBackup chooses what a resume does with the host copies it
// restored (Note [Host copies after a resume]).
type ResumeBackup uint8

const (
	// ResumeKeepBackup: kept for the next cycles; a pageable stand-in is
	// replaced by the copy pinned ahead at a later pause.
	ResumeKeepBackup ResumeBackup = iota
	// ResumeRetainBackup: kept, and at the same address until a resume
	// that does not retain them: BackupOf gives the same host address
	// after the resume and at the next pause (torch_memory_saver's
	// retain_cpu_backup).
	ResumeRetainBackup
	// ResumeReleaseBackup: given back. A pinned copy stays with its
	// segment as the copy pinned ahead of its next pause where
	// SYMMEM_BACKUP_PIN_AHEAD allows; other copies are freed.
	ResumeReleaseBackup
)

// Note [Host copies after a resume]
//
// libsymmem's own resume keeps a segment's host copy for the next cycle,
// so that a later pause never allocates. The drop-ins give host memory
// back as torch_memory_saver and vLLM do: pinned memory is held from the
// pause to the resume, then released, unless the caller retains it. What
// keeps their pauses at copy speed is the bound of Note [Pinned ahead]: a
// released pinned copy stays with its segment, unfilled (BackupOf finds
// nothing), as the copy pinned ahead of the next pause, while the bytes
// so held stay within SYMMEM_BACKUP_PIN_AHEAD; past it the copy is freed
// and the next pause pins, as torch_memory_saver's does. Pageable and disk
// copies are always freed.
//
// A retained copy stays where it is until a resume that does not retain
// it, even where the copy pinned ahead has arrived in the meantime: a
// caller may hold its address (torch_memory_saver's get_cpu_backup with
// zero_copy). And once a segment has nothing allocated in it, a copy that
// holds what a pause saved is of no use to anyone: the last free frees it
// (the segment pins a new copy ahead with its next first block, as a new
// segment does), and a pause copies nothing of it.

// ResumeWith is Resume with options.
func (a *Allocator) ResumeWith(tag string, o ResumeOptions) (uint64, error) {
	c, err := ChooseTag(tag)
	if err != nil {
		return 0, err
	}
	return a.ResumeChosen(c, o)
}

// ResumeChosen is ResumeWith of a tag already resolved.
func (a *Allocator) ResumeChosen(c TagChoice, o ResumeOptions) (uint64, error) {
	a.lock()
	defer a.mu.Unlock()
	tags, err := a.tagsToChange(c, true)
	if err != nil {
		return 0, err
	}
	return a.resumeLocked(c.name, tags, o)
}

// resumeLocked resumes tags, the tags that a resume of tag acts on (a.mu
// held).
func (a *Allocator) resumeLocked(tag string, tags []*tagState, o ResumeOptions) (uint64, error) {
	var segs []*segment
	var need uint64
	for _, seg := range a.segmentsOf(tags) {
		if seg.paused {
			segs = append(segs, seg)
			need += uint64(seg.size)
		}
	}
	what := tag
	if what == "" {
		what = "(every paused tag)"
	}
	oom := func(detail string) error {
		a.st.numOOM++
		return core.Errorf(core.ErrOutOfMemory, "resuming tag %q on device %d needs %d bytes: %s; nothing was mapped, the tag stays paused and resume may be retried",
			what, a.device, need, detail)
	}
	overLimit := func() bool {
		return a.limit != 0 && uint64(a.st.by[statReservedBytes][poolAll].current)+need > a.limit
	}
	if overLimit() {
		a.st.numAllocRetry++
		if err := a.releaseIdle(); err != nil {
			return 0, err
		}
		if overLimit() {
			return 0, oom(fmt.Sprintf("the memory limit is %d bytes and %d are reserved", a.limit, a.st.by[statReservedBytes][poolAll].current))
		}
	}
	mems := make([]core.Memory, 0, len(segs))
	undo := func() {
		for i, m := range mems {
			_ = a.be.Unmap(a.device, segs[i].addr, segs[i].size)
			_ = a.be.Release(m)
		}
	}
	retried := false
	for i := 0; i < len(segs); i++ {
		seg := segs[i]
		m, err := a.be.Create(a.device, seg.size)
		if err != nil && core.CodeOf(err) == core.ErrOutOfMemory && !retried {
			retried = true
			a.st.numAllocRetry++
			if rerr := a.releaseIdle(); rerr != nil {
				undo()
				return 0, rerr
			}
			m, err = a.be.Create(a.device, seg.size)
		}
		if err == nil {
			if err = a.mapSegment(seg.pools.tag, seg.addr, seg.size, m); err != nil {
				_ = a.be.Release(m)
			}
		}
		if err != nil {
			undo()
			if core.CodeOf(err) == core.ErrOutOfMemory {
				return 0, oom(err.Error())
			}
			return 0, core.Errorf(core.CodeOf(err), "resuming tag %q on device %d: mapping %d bytes at %#x: %v; nothing was mapped, the tag stays paused", what, a.device, seg.size, seg.addr, err)
		}
		mems = append(mems, m)
	}
	restores := make([]core.FillOrCopy, 0, len(segs))
	for _, seg := range segs {
		switch {
		case seg.backupValid:
			restores = append(restores, core.FillOrCopy{Dst: seg.addr, Src: seg.backup, Size: seg.size})
		case !o.NoFill:
			restores = append(restores, core.FillOrCopy{Dst: seg.addr, Size: seg.size, Fill: true})
		}
	}
	if err := a.fillOrCopy(restores); err != nil {
		if core.CodeOf(err) == core.ErrTimeout {
			// The restores may still be running into the new memory:
			// it must not be released under them (DESIGN invariant 4).
			return 0, core.Errorf(core.ErrTimeout, "resuming tag %q on device %d: restoring %d bytes did not finish: %v; the device is stuck: the memory mapped for it stays mapped (leaked, it may still be written) and the tag stays paused", what, a.device, need, err)
		}
		undo()
		return 0, core.Errorf(core.CodeOf(err), "resuming tag %q on device %d: restoring %d bytes: %v; nothing was mapped, the tag stays paused", what, a.device, need, err)
	}
	for i, seg := range segs {
		seg.paused = false
		seg.mem = mems[i]
		a.st.add(statPausedBytes, seg.small, -int64(seg.size))
		a.st.add(statReservedBytes, seg.small, int64(seg.size))
		switch o.Backup {
		case ResumeReleaseBackup:
			a.releaseBackup(seg)
		case ResumeRetainBackup:
			seg.backupRetained = seg.backupValid
		default:
			seg.backupRetained = false
		}
	}
	for _, t := range tags {
		t.paused = false
	}
	return need, nil
}

// fillOrCopy runs ops: in one batch on backends with BatchMemOps (one wait,
// bounded by SYMMEM_TIMEOUT_MS), else one by one on the default stream.
func (a *Allocator) fillOrCopy(ops []core.FillOrCopy) error {
	if len(ops) == 0 {
		return nil
	}
	if b, ok := a.be.(core.BatchMemOps); ok {
		return b.FillOrCopyWithin(a.device, ops, core.DefaultTimeout())
	}
	for _, op := range ops {
		var err error
		if op.Fill {
			err = a.be.Memset(a.device, 0, op.Dst, op.Value, op.Size)
		} else {
			err = a.be.Copy(a.device, 0, op.Dst, op.Src, op.Size)
		}
		if err != nil {
			return core.Errorf(core.CodeOf(err), "%d bytes at %#x: %v", op.Size, op.Dst, err)
		}
	}
	return nil
}

// Note [Pausing every device]
//
// symmem_pause and symmem_resume act on every device's allocator made so
// far. A named tag is paused on the devices where it is live (resumed where
// it is paused) and the others are left alone, so that a call after a
// partial failure on several devices finishes the rest; a tag in the other
// state on every device is the first device's ErrInvalidState ("already
// paused", "not paused").
//
// The state is read and changed under one lock (Runtime.changing), held
// from the first device's check to the last device's pause. Read, unlock,
// then pause (as export/pause.go did) let two concurrent pauses of one tag
// both see it live on a device after one had paused another device: each
// then paused some devices with its own options and both succeeded, or the
// slower one failed with ErrInvalidState after pausing devices itself
// (TestConcurrentPausesOfOneTag). Now two concurrent pauses of one tag
// behave as if one came after the other: exactly one pauses it, and the
// other returns ErrInvalidState saying that the tag is already paused (the
// same answer as a second pause after the first has returned). Resumes
// likewise. A pause of every tag ("") that comes second finds nothing live
// and succeeds. The lock serialises pauses and resumes of different tags
// too; each is a device synchronisation and copies, so little is lost.
//
// The caller resolves the tag's name once (ChooseTag), and each device's
// allocator is locked once per call: its tag's state is checked and changed
// under that one lock (changeIfInState), so no other thread's allocation
// can come between the check and the change on that device.

// PauseTag pauses c on every device where it is live (Note [Pausing every
// device]).
func (r *Runtime) PauseTag(c TagChoice, o PauseOptions) error {
	return r.changeTag(c, false, func(a *Allocator, tags []*tagState) error {
		_, err := a.pauseLocked(c.name, tags, o)
		return err
	})
}

// ResumeTag resumes c on every device where it is paused (Note [Pausing
// every device]).
func (r *Runtime) ResumeTag(c TagChoice, o ResumeOptions) error {
	return r.changeTag(c, true, func(a *Allocator, tags []*tagState) error {
		_, err := a.resumeLocked(c.name, tags, o)
		return err
	})
}

// changeTag runs change on every allocator where c is in the state change
// acts on (paused for a resume, live for a pause), under r.changing; a
// named tag in the other state on every device is the first device's
// ErrInvalidState.
func (r *Runtime) changeTag(c TagChoice, paused bool, change func(a *Allocator, tags []*tagState) error) error {
	r.changing.Lock()
	defer r.changing.Unlock()
	var wrongState error
	did := false
	for _, a := range r.Allocators() {
		skipped, err := a.changeIfInState(c, paused, change)
		if skipped != nil {
			if wrongState == nil {
				wrongState = skipped
			}
			continue
		}
		did = true
		if err != nil {
			return err
		}
	}
	if !c.Every() && !did {
		return wrongState
	}
	return nil
}

// changeIfInState runs change on the tags of c here under one lock, unless
// c is a named tag in the other state here: then it changes nothing and
// returns that ErrInvalidState as skipped.
func (a *Allocator) changeIfInState(c TagChoice, paused bool, change func(a *Allocator, tags []*tagState) error) (skipped, err error) {
	a.lock()
	defer a.mu.Unlock()
	tags, err := a.tagsToChange(c, paused)
	if err != nil {
		if !c.Every() && core.CodeOf(err) == core.ErrInvalidState {
			return err, nil
		}
		return nil, err
	}
	return nil, change(a, tags)
}
