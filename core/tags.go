package core

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Note [Tags and pause]
//
// A tag names memory that can be given back whole and taken again later at
// the same addresses (a model's weights, a KV cache). Allocations made while
// a region of tag T is open on the calling thread carry T: their blocks come
// from pools keyed by (T, stream), which carve only T's segments, so no
// segment ever mixes tags and a tag's memory is exactly a set of segments.
//
// Pause(T) waits for the device's work, copies each of T's segments to a
// host buffer if T asked for backup, unmaps the segment and releases its
// physical memory. The segment stays in the heap, with its blocks and its
// address range (still reserved), so pointers into it stay what they were;
// its bytes move from reserved_bytes to paused_bytes. Resume(T) creates new
// physical memory for each paused segment, maps it at the same address with
// the same access, and restores the backup (or zeroes it: without backup the
// contents are zero after a resume). A resume that fails undoes what it
// mapped, so the tag is then exactly as paused as before, and may be retried.
//
// Where the time goes: a pause is one device synchronisation, the copies,
// and an unmap and release per segment; a resume a create and map per
// segment, then the restores and fills. The copies of a pause, and the
// restores and fills of a resume, are queued together on the library's own
// stream and waited for once (BatchMemOps), not once per segment. Without
// backup the zero-fill is the resume's largest cost after the driver's own
// (a pass over the memory at device bandwidth); ResumeOptions.NoFill skips
// it for callers that overwrite the memory anyway. Where the host copy
// lives (pinned, pageable, a file) is the tag's BackupKind; a pause may
// override it (PauseOptions.Backup: discard, or keep a copy of a tag
// without backup), which is how vLLM's sleep(offload_tags) maps here.
//
// Placement stays a function of the call sequence (DESIGN invariant 2):
// which tag a call uses is part of the call sequence (the region calls), the
// (tag, stream) pools are numbered by first use, and new segments of any tag
// go to the lowest heap offset where they fit, paused segments counting as
// occupied. Pause and resume never move anything.
//
// Segments whose descriptor went to other processes (a rendezvous exported
// them) are paused only collectively (symm.Group.Pause): a local pause could
// not return their memory, which the peers' imports keep alive, and a resume
// would give this process memory that the peers do not see.

// TagID names a tag process-wide; 0 is the untagged memory.
type TagID int32

// MaxTagLen is the longest tag name.
const MaxTagLen = 64

// BackupKind says where a tag's contents go while it is paused.
type BackupKind uint8

const (
	// BackupNone: the contents are dropped; a resume zero-fills.
	BackupNone BackupKind = iota
	// BackupPinned: a host copy in pinned memory where the backend has
	// it (HostMemory), pinned ahead of the first pause (Note [Pinned ahead]).
	BackupPinned
	// BackupPageable: a host copy in anonymous pageable memory, which the
	// kernel may swap or reclaim; copies run slower than from pinned memory
	// (torch_memory_saver's cpu_backup_backend="mmap").
	BackupPageable
	// BackupDisk: a host copy in a file of the backup directory
	// (SetBackupDir, SYMMEM_BACKUP_DIR, else the temporary directory),
	// mapped shared; after the pause's copy it is written out and its pages
	// dropped from memory, and the resume reads it back.
	BackupDisk
)

func (k BackupKind) String() string {
	switch k {
	case BackupNone:
		return "none"
	case BackupPinned:
		return "pinned"
	case BackupPageable:
		return "pageable"
	case BackupDisk:
		return "disk"
	}
	return fmt.Sprintf("BackupKind(%d)", uint8(k))
}

// tagInfo is what the process knows of a tag, whatever the device.
type tagInfo struct {
	name   string
	backup BackupKind
}

// tagRegistry numbers tags process-wide. Tags are never forgotten: an ID
// stays valid for the life of the process (there are few tags).
var tagRegistry = struct {
	sync.Mutex
	byName map[string]TagID
	info   []tagInfo // info[id]; info[0] is the untagged memory
}{byName: map[string]TagID{}, info: []tagInfo{{}}}

// CheckName checks a short name (group names, tags): 1..maxLen letters,
// digits, '.', '_', '-', and not "." or "..". what names the kind of name in
// the error ("group name", "tag"), which quotes the name cut to a readable
// length (Quote; the calls' descriptions leave names to these errors, Note
// [Bounded messages]).
func CheckName(what, name string, maxLen int) error {
	if len(name) == 0 || len(name) > maxLen {
		return Errorf(ErrInvalidArgument, "%s %s must have 1 to %d characters", what, Quote(name), maxLen)
	}
	if name == "." || name == ".." {
		return Errorf(ErrInvalidArgument, "%s %q is not allowed", what, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return Errorf(ErrInvalidArgument, "%s %s has the character %q at %d: only letters, digits, '.', '_' and '-' are allowed", what, Quote(name), c, i)
		}
	}
	return nil
}

// RegisterTag returns the ID of tag name, making it on first use. backup
// (where a host copy is kept across a pause) is a property of the tag:
// every region of a tag must ask for the same.
func RegisterTag(name string, backup BackupKind) (TagID, error) {
	if backup > BackupDisk {
		return 0, Errorf(ErrInvalidArgument, "tag %q: unknown backup kind %d", name, uint8(backup))
	}
	if err := CheckName("tag", name, MaxTagLen); err != nil {
		return 0, err
	}
	r := &tagRegistry
	r.Lock()
	defer r.Unlock()
	if id, ok := r.byName[name]; ok {
		if r.info[id].backup != backup {
			return 0, Errorf(ErrInvalidArgument, "tag %q was opened with backup %v before; every region of a tag must ask for the same backup", name, r.info[id].backup)
		}
		return id, nil
	}
	id := TagID(len(r.info))
	r.info = append(r.info, tagInfo{name: name, backup: backup})
	r.byName[name] = id
	return id, nil
}

// LookupTag returns the ID of a registered tag.
func LookupTag(name string) (TagID, bool) {
	tagRegistry.Lock()
	defer tagRegistry.Unlock()
	id, ok := tagRegistry.byName[name]
	return id, ok
}

// KnownTag returns the ID of tag name, which a region must have registered:
// a malformed name is CheckName's error, an unknown one ErrInvalidArgument.
func KnownTag(name string) (TagID, error) {
	if id, ok := LookupTag(name); ok {
		return id, nil
	}
	if err := CheckName("tag", name, MaxTagLen); err != nil {
		return 0, err
	}
	return 0, Errorf(ErrInvalidArgument, "tag %q is unknown: no region of it was opened", name)
}

func tagInfoOf(id TagID) (tagInfo, bool) {
	tagRegistry.Lock()
	defer tagRegistry.Unlock()
	if id < 0 || int(id) >= len(tagRegistry.info) {
		return tagInfo{}, false
	}
	return tagRegistry.info[id], true
}

// tagState is a tag on one device.
//
// Invariants (Validate checks the first): a segment is paused only while
// its tag is (the untagged memory, tags[0], never is); paused is true from a
// successful Pause to a successful Resume, and while it is no block of the
// tag can be allocated. A pause that fails after releasing some segments
// leaves the tag paused, so that Resume takes those back.
type tagState struct {
	id     TagID
	name   string
	backup BackupKind
	paused bool
}

// tagLocked returns the state of tag id here, making it at first use.
func (a *Allocator) tagLocked(id TagID) (*tagState, error) {
	if int(id) < len(a.tags) && a.tags[id] != nil {
		return a.tags[id], nil
	}
	info, ok := tagInfoOf(id)
	if !ok || id == 0 {
		return nil, Errorf(ErrInvalidArgument, "tag number %d is not registered", id)
	}
	for int(id) >= len(a.tags) {
		a.tags = append(a.tags, nil)
	}
	t := &tagState{id: id, name: info.name, backup: info.backup}
	a.tags[id] = t
	return t, nil
}

// info describes seg for peers and callers.
func (seg *segment) info() SegmentInfo {
	return SegmentInfo{ID: seg.id, Addr: seg.addr, Size: seg.size, HeapOff: seg.heapOff, Tag: seg.pools.tag.name, Paused: seg.paused}
}

// selectTags returns the tags that name designates here ("" = every tag
// this device has seen), or an error for an unknown name. A tag registered
// in the process but never used on this device has nothing here to pause.
func (a *Allocator) selectTags(name string) ([]*tagState, error) {
	if name == "" {
		var out []*tagState
		for _, t := range a.tags[1:] {
			if t != nil {
				out = append(out, t)
			}
		}
		return out, nil
	}
	id, err := KnownTag(name)
	if err != nil {
		return nil, err
	}
	t, err := a.tagLocked(id)
	if err != nil {
		return nil, err
	}
	return []*tagState{t}, nil
}

// segmentsOf lists the segments of tags in heap order.
func (a *Allocator) segmentsOf(tags []*tagState) []*segment {
	in := map[*tagState]bool{}
	for _, t := range tags {
		in[t] = true
	}
	var out []*segment
	for _, seg := range a.heap.segments {
		if in[seg.pools.tag] {
			out = append(out, seg)
		}
	}
	return out
}

// PauseOptions modify Pause.
type PauseOptions struct {
	// Collective: the caller (symm.Group.Pause) drops the peers' imports
	// of exported segments itself, so they may be paused.
	Collective bool
	// Backup overrides, for this pause only, what the tag keeps.
	Backup PauseBackup
}

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

// TagSegments lists the segments of tag ("" = every tag used here) in heap
// order, checking that every selected tag is paused (wantPaused) or live.
func (a *Allocator) TagSegments(tag string, wantPaused bool) ([]SegmentInfo, error) {
	a.lock()
	defer a.mu.Unlock()
	tags, err := a.selectTags(tag)
	if err != nil {
		return nil, err
	}
	if tag != "" {
		if err := checkTagState(tags[0], wantPaused, a.device); err != nil {
			return nil, err
		}
	}
	var out []SegmentInfo
	for _, seg := range a.segmentsOf(filterTags(tags, wantPaused)) {
		out = append(out, seg.info())
	}
	return out, nil
}

func checkTagState(t *tagState, wantPaused bool, device int) error {
	switch {
	case wantPaused && !t.paused:
		return Errorf(ErrInvalidState, "tag %q on device %d is not paused: nothing to resume", t.name, device)
	case !wantPaused && t.paused:
		return Errorf(ErrInvalidState, "tag %q on device %d is already paused", t.name, device)
	}
	return nil
}

// filterTags keeps the tags whose paused state is paused.
func filterTags(tags []*tagState, paused bool) []*tagState {
	var out []*tagState
	for _, t := range tags {
		if t.paused == paused {
			out = append(out, t)
		}
	}
	return out
}

// tagsToChange returns the tags that a pause (paused false) or a resume
// (paused true) of tag acts on: the named one, which must be in that state,
// or ("") every tag used on this device that is (a.mu held).
func (a *Allocator) tagsToChange(tag string, paused bool) ([]*tagState, error) {
	tags, err := a.selectTags(tag)
	if err != nil {
		return nil, err
	}
	if tag != "" {
		if err := checkTagState(tags[0], paused, a.device); err != nil {
			return nil, err
		}
	}
	return filterTags(tags, paused), nil
}

// Pause releases the physical memory of tag ("" = every live tag used on
// this device) as Note [Tags and pause] says, and returns the bytes released.
// A named tag that is already paused is ErrInvalidState; an unknown one
// ErrInvalidArgument. If waiting for the device or making the backup fails,
// nothing is unmapped.
func (a *Allocator) Pause(tag string, o PauseOptions) (uint64, error) {
	a.lock()
	defer a.mu.Unlock()
	tags, err := a.tagsToChange(tag, false)
	if err != nil {
		return 0, err
	}
	segs := a.segmentsOf(tags)
	if !o.Collective {
		for _, seg := range segs {
			if seg.exported {
				return 0, Errorf(ErrInvalidState, "tag %q on device %d: its segment at heap offset %#x was rendezvoused with other processes; pause it with symmem_pause_group on that group", seg.pools.tag.name, a.device, seg.heapOff)
			}
		}
	}
	// Nothing may be unmapped while the device may use it (DESIGN
	// invariant 4); the backup reads memory the device may be writing.
	a.st.numSyncAll++
	if err := a.be.SynchronizeDevice(a.device); err != nil {
		return 0, Errorf(CodeOf(err), "pausing tag %q on device %d: waiting for the device's work failed, nothing was released: %v", tag, a.device, err)
	}
	// What others registered on the segments (NCCL windows) is undone
	// before their memory goes, as for any release.
	for _, seg := range segs {
		if err := a.runReleaseHooks(seg); err != nil {
			return 0, Errorf(CodeOf(err), "pausing tag %q on device %d: the segment at %#x: %v; nothing was released", seg.pools.tag.name, a.device, seg.addr, err)
		}
	}
	var copies []FillOrCopy
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
			return 0, Errorf(CodeOf(err), "pausing tag %q on device %d: a host backup of %d bytes: %v; nothing was released", seg.pools.tag.name, a.device, seg.size, err)
		}
		copies = append(copies, FillOrCopy{Dst: seg.backup, Src: seg.addr, Size: seg.size})
		copied = append(copied, seg)
	}
	if err := a.fillOrCopy(copies); err != nil {
		return 0, Errorf(CodeOf(err), "pausing tag %q on device %d: copying %d segments to the host: %v; nothing was released", tag, a.device, len(copies), err)
	}
	for _, seg := range copied {
		if seg.backupFile != nil {
			if err := spillBackup(seg); err != nil {
				return 0, Errorf(CodeOf(err), "pausing tag %q on device %d: the segment at %#x: %v; nothing was released", seg.pools.tag.name, a.device, seg.addr, err)
			}
		}
		seg.backupValid = true
	}
	for _, t := range tags {
		t.paused = true
	}
	var released uint64
	for _, seg := range segs {
		if err := a.be.Unmap(a.device, seg.addr, seg.size); err != nil {
			return released, Errorf(CodeOf(err), "pausing tag %q on device %d: unmapping the segment at %#x: %v (segments released before it stay paused; resume takes them back)", seg.pools.tag.name, a.device, seg.addr, err)
		}
		if err := a.be.Release(seg.mem); err != nil {
			// Unmapped but not released: mark it paused anyway (the
			// handle is lost to us), so that nothing uses it again.
			err = Errorf(CodeOf(err), "pausing tag %q on device %d: the segment at %#x was unmapped but its physical memory could not be released (leaked; the segment counts as paused): %v", seg.pools.tag.name, a.device, seg.addr, err)
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
	// it for callers that overwrite the memory anyway.
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
	a.lock()
	defer a.mu.Unlock()
	tags, err := a.tagsToChange(tag, true)
	if err != nil {
		return 0, err
	}
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
		return Errorf(ErrOutOfMemory, "resuming tag %q on device %d needs %d bytes: %s; nothing was mapped, the tag stays paused and resume may be retried",
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
	mems := make([]Memory, 0, len(segs))
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
		if err != nil && CodeOf(err) == ErrOutOfMemory && !retried {
			retried = true
			a.st.numAllocRetry++
			if rerr := a.releaseIdle(); rerr != nil {
				undo()
				return 0, rerr
			}
			m, err = a.be.Create(a.device, seg.size)
		}
		if err == nil {
			if err = a.be.Map(a.device, seg.addr, seg.size, m); err != nil {
				_ = a.be.Release(m)
			}
		}
		if err != nil {
			undo()
			if CodeOf(err) == ErrOutOfMemory {
				return 0, oom(err.Error())
			}
			return 0, Errorf(CodeOf(err), "resuming tag %q on device %d: mapping %d bytes at %#x: %v; nothing was mapped, the tag stays paused", what, a.device, seg.size, seg.addr, err)
		}
		mems = append(mems, m)
	}
	restores := make([]FillOrCopy, 0, len(segs))
	for _, seg := range segs {
		switch {
		case seg.backupValid:
			restores = append(restores, FillOrCopy{Dst: seg.addr, Src: seg.backup, Size: seg.size})
		case !o.NoFill:
			restores = append(restores, FillOrCopy{Dst: seg.addr, Size: seg.size, Fill: true})
		}
	}
	if err := a.fillOrCopy(restores); err != nil {
		if CodeOf(err) == ErrTimeout {
			// The restores may still be running into the new memory:
			// it must not be released under them (DESIGN invariant 4).
			return 0, Errorf(ErrTimeout, "resuming tag %q on device %d: restoring %d bytes did not finish: %v; the device is stuck: the memory mapped for it stays mapped (leaked, it may still be written) and the tag stays paused", what, a.device, need, err)
		}
		undo()
		return 0, Errorf(CodeOf(err), "resuming tag %q on device %d: restoring %d bytes: %v; nothing was mapped, the tag stays paused", what, a.device, need, err)
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

// TagBytes returns the bytes of tag's segments on this device, live and
// paused (0, 0 for a tag registered but not used here; ErrInvalidArgument
// for an unknown one).
func (a *Allocator) TagBytes(tag string) (live, paused uint64, err error) {
	id, err := KnownTag(tag)
	if err != nil {
		return 0, 0, err
	}
	a.lock()
	defer a.mu.Unlock()
	for _, seg := range a.heap.segments {
		if seg.pools.tag == nil || seg.pools.tag.id != id {
			continue
		}
		if seg.paused {
			paused += uint64(seg.size)
		} else {
			live += uint64(seg.size)
		}
	}
	return live, paused, nil
}

// TagNames lists the tags used on this device, paused or not, by name.
func (a *Allocator) TagNames() (live, paused []string) {
	a.lock()
	defer a.mu.Unlock()
	for _, t := range a.tags[1:] {
		if t == nil {
			continue
		}
		if t.paused {
			paused = append(paused, t.name)
		} else {
			live = append(live, t.name)
		}
	}
	sort.Strings(live)
	sort.Strings(paused)
	return live, paused
}

// fillOrCopy runs ops: in one batch on backends with BatchMemOps (one wait,
// bounded by SYMMEM_TIMEOUT_MS), else one by one on the default stream.
func (a *Allocator) fillOrCopy(ops []FillOrCopy) error {
	if len(ops) == 0 {
		return nil
	}
	if b, ok := a.be.(BatchMemOps); ok {
		return b.FillOrCopyWithin(a.device, ops, DefaultTimeout())
	}
	for _, op := range ops {
		var err error
		if op.Fill {
			err = a.be.Memset(a.device, 0, op.Dst, op.Value, op.Size)
		} else {
			err = a.be.Copy(a.device, 0, op.Dst, op.Src, op.Size)
		}
		if err != nil {
			return Errorf(CodeOf(err), "%d bytes at %#x: %v", op.Size, op.Dst, err)
		}
	}
	return nil
}

// HostMemory is implemented by backends that allocate host memory suited to
// copies with their devices (pinned memory on cuda). Pinned backups use it
// where it exists, and anonymous memory otherwise.
type HostMemory interface {
	AllocHost(device int, size uintptr) (uintptr, error)
	FreeHost(device int, addr, size uintptr) error
}

// Note [Pinned ahead]
//
// A pinned host copy makes the pause's copy run at the link's speed, but
// pinning costs more than the copy: cuMemHostAlloc of 4 GiB takes about 2 s
// on an H200 host, the copy about 80 ms. So a segment of a tag with pinned
// backup starts pinning its host copy in the background when the segment is
// created, and the first pause finds it ready. A pause never waits for
// pinning: a segment whose pinning is still running (a pause right after
// the allocation) copies to anonymous pageable memory instead (slower than
// to pinned memory, faster than the pinning left to do), and its pinned
// copy takes over at the next pause. SYMMEM_BACKUP_PIN_AHEAD bounds the
// bytes pinned this way per device (default: a quarter of the host memory
// the process may use, shared among the machine's GPUs: pinAheadDefault;
// 0 turns it off); a
// segment over the bound pins at its first pause, as without pinning
// ahead. The copy is kept for the next cycles (later pauses never pin), and
// goes with the segment. Pinning ahead holds host memory while the tag is
// live: that is the price of a first pause at copy speed, and what the
// bound limits. Four pinnings run at a time (pinSlots).
//
// The other designs weighed: a bounded pool of pinned staging buffers
// feeding pageable memory needs a host-side memcpy of every byte after the
// device copy (two passes, each at about the speed of one PCIe direction
// on a one-socket host), on every pause; pinning ahead pays the pinning
// once, off the pause's path, and every pause is then one pass at link
// speed.
//
// Only the allocation runs in the background; a.mu is never taken there,
// and the segment learns the address at its first pause or release
// (prepin.done), so a segment released before its pinning finished hands
// the memory back when it arrives.

// prepin is a host copy being pinned ahead for one segment.
type prepin struct {
	done chan struct{} // closed when addr, err are set
	addr uintptr
	err  error
}

// startPinAhead begins pinning seg's host copy in the background, if the
// backend pins host memory and the bound allows (a.mu held).
func (a *Allocator) startPinAhead(seg *segment) {
	h, ok := a.be.(HostMemory)
	if !ok || seg.pools.tag == nil || seg.pools.tag.backup != BackupPinned {
		return
	}
	if a.pinnedAhead+uint64(seg.size) > pinAheadLimit() {
		return
	}
	a.pinnedAhead += uint64(seg.size)
	seg.pinnedAhead = true
	p := &prepin{done: make(chan struct{})}
	seg.prepin = p
	dev, size := a.device, seg.size
	pinsPending.Add(1)
	go func() {
		pinSlots <- struct{}{}
		p.addr, p.err = h.AllocHost(dev, size)
		<-pinSlots
		close(p.done)
		pinsPending.Add(-1)
	}()
}

// pinWaitMax is the largest segment whose pause waits for its pinning
// ahead still in flight rather than copy to a pageable stand-in, where no
// more pinnings are pending than pinSlots runs at once (behind a queue the
// wait would be the queue's).
const pinWaitMax = 32 << 20

// pinsPending counts the pinnings ahead started and not yet finished.
var pinsPending atomic.Int64

// pinSlots bounds the pinnings ahead in flight (each a blocking driver call
// on a thread of its own): a model of thousands of segments must not start
// thousands of threads. Four keep the kernel's page zeroing busy on several
// cores.
var pinSlots = make(chan struct{}, 4)

// ensureBackup gives seg a host copy of kind (a.mu held): the one pinned
// ahead once it has arrived (freeing a pageable stand-in of an earlier
// pause), the one it has, a pageable stand-in while the pinning is still
// running (a pause never waits for pinning), or a new one.
func (a *Allocator) ensureBackup(seg *segment, kind BackupKind) error {
	if p := seg.prepin; p != nil {
		select {
		case <-p.done:
			if seg.backupRetained && seg.backup != 0 {
				// A retained copy stays where it is (Note [Host copies
				// after a resume]); the pinned one waits.
				return nil
			}
			seg.prepin = nil
			if p.err == nil {
				a.freeBackupMemory(seg)
				seg.backup, seg.backupPinned = p.addr, true
				return nil
			}
			// Pinning ahead failed (host memory was short then): go on
			// with the copy there is, or make one now.
		default:
			if seg.backup != 0 {
				return nil
			}
			if seg.size > pinWaitMax || pinsPending.Load() > int64(cap(pinSlots)) {
				return a.anonymousBackup(seg)
			}
			// A small segment whose pinning is under way (no queue
			// before it) waits: it ends about as soon as a pageable
			// stand-in would be made, and the copy is then the pinned
			// one from the first pause.
			<-p.done
			return a.ensureBackup(seg, kind)
		}
	}
	if seg.backup != 0 {
		return nil
	}
	if kind == BackupPinned {
		if h, ok := a.be.(HostMemory); ok {
			p, err := h.AllocHost(a.device, seg.size)
			if err != nil {
				return err
			}
			seg.backup, seg.backupPinned = p, true
			return nil
		}
	}
	if kind == BackupDisk {
		return a.diskBackup(seg)
	}
	return a.anonymousBackup(seg)
}

// anonymousBackup gives seg a host copy in anonymous pageable memory.
func (a *Allocator) anonymousBackup(seg *segment) error {
	p, err := unix.MmapPtr(-1, 0, nil, seg.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return Errorf(ErrOutOfMemory, "mmap of %d bytes of host memory: %v", seg.size, err)
	}
	seg.backup, seg.backupPinned = uintptr(p), false
	return nil
}

// backupDir is the directory of disk backups set by SetBackupDir ("":
// SYMMEM_BACKUP_DIR, else the temporary directory).
var backupDir atomic.Value

// SetBackupDir sets the directory of disk backups (made if missing); ""
// goes back to SYMMEM_BACKUP_DIR, else the temporary directory. Files
// already made stay where they are.
func SetBackupDir(dir string) error {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) { // its text would repeat the path
				err = pe.Err
			}
			return Errorf(ErrInvalidArgument, "backup directory %s: %v", Quote(dir), err)
		}
	}
	backupDir.Store(dir)
	return nil
}

// BackupDir is the directory where disk backups go.
func BackupDir() string {
	if d, _ := backupDir.Load().(string); d != "" {
		return d
	}
	return Current().Text("SYMMEM_BACKUP_DIR", os.TempDir())
}

// diskBackup gives seg a host copy in an unlinked file of BackupDir,
// mapped shared (the file goes with the mapping).
func (a *Allocator) diskBackup(seg *segment) error {
	dir := BackupDir()
	f, err := os.CreateTemp(dir, "symmem-backup-*")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) { // its text would repeat the directory
			err = pe.Err
		}
		return Errorf(ErrInvalidState, "a disk backup in %s: %v (set the directory with symmem_set_backup_dir or SYMMEM_BACKUP_DIR)", Quote(dir), err)
	}
	_ = os.Remove(f.Name())
	fail := func(what string, err error) error {
		_ = f.Close()
		code := ErrInvalidState
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
			code = ErrOutOfMemory
		}
		return Errorf(code, "a disk backup of %d bytes in %s: %s: %v", seg.size, Quote(dir), what, err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(seg.size)); err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.EINVAL) {
			return fail("fallocate", err)
		}
		if err := f.Truncate(int64(seg.size)); err != nil {
			return fail("ftruncate", err)
		}
	}
	p, err := unix.MmapPtr(int(f.Fd()), 0, nil, seg.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	seg.backup, seg.backupPinned, seg.backupFile = uintptr(p), false, f
	return nil
}

// spillBackup writes seg's disk backup out and drops its pages from the
// process and the page cache (the resume reads the file back).
func spillBackup(seg *segment) error {
	b := unsafe.Slice((*byte)(ptrAt(seg.backup)), seg.size)
	if err := unix.Msync(b, unix.MS_SYNC); err != nil {
		return Errorf(ErrInvalidState, "writing the disk backup out (msync): %v", err)
	}
	_ = unix.Madvise(b, unix.MADV_DONTNEED)
	_ = unix.Fadvise(int(seg.backupFile.Fd()), 0, int64(seg.size), unix.FADV_DONTNEED)
	return nil
}

// releaseBackup gives back seg's host copy after a resume
// (ResumeReleaseBackup, Note [Host copies after a resume]): a pinned copy
// stays as the one pinned ahead of the next pause where the bound allows,
// any other is freed.
func (a *Allocator) releaseBackup(seg *segment) {
	seg.backupValid, seg.backupRetained = false, false
	if seg.backup == 0 {
		return
	}
	if seg.backupPinned && seg.backupFile == nil {
		if seg.pinnedAhead {
			return
		}
		if seg.prepin == nil && a.pinnedAhead+uint64(seg.size) <= pinAheadLimit() {
			a.pinnedAhead += uint64(seg.size)
			seg.pinnedAhead = true
			return
		}
	}
	a.freeBackupMemory(seg)
}

// forgetBackup frees the host copy of seg, in which nothing is allocated
// any more, if it holds what a pause saved: nobody may read it (Note [Host
// copies after a resume]). The segment pins a new copy ahead when it gets
// a block again.
func (a *Allocator) forgetBackup(seg *segment) {
	if seg.backupValid {
		a.dropBackup(seg)
	}
}

// HostMemoryLimit, set by the host backend's package, returns the host
// memory this process may use: the RAM, or the memory cgroup's limit where
// that is smaller (0: unknown).
var HostMemoryLimit func() uint64

// pinAheadLimit is SYMMEM_BACKUP_PIN_AHEAD: the bytes per device of host
// copies pinned ahead (Note [Pinned ahead]).
func pinAheadLimit() uint64 {
	return Current().Size("SYMMEM_BACKUP_PIN_AHEAD", pinAheadDefault())
}

// pinAheadDefault is SYMMEM_BACKUP_PIN_AHEAD's default: a quarter of the
// host memory this process may use, shared among the machine's GPUs (as
// /proc/driver/nvidia/gpus lists them, whatever CUDA_VISIBLE_DEVICES shows
// this process), so that the processes of a machine, one per GPU, hold at
// most a quarter of it together. Unknown memory: no bound.
var pinAheadDefault = sync.OnceValue(func() uint64 {
	var mem uint64
	if HostMemoryLimit != nil {
		mem = HostMemoryLimit()
	}
	if mem == 0 {
		return math.MaxUint64
	}
	gpus := 1
	if ents, err := os.ReadDir("/proc/driver/nvidia/gpus"); err == nil && len(ents) > 1 {
		gpus = len(ents)
	}
	return mem / 4 / uint64(gpus)
})

// dropBackup frees seg's host copy, if any, and one still being pinned
// ahead once it arrives.
func (a *Allocator) dropBackup(seg *segment) {
	if seg.pinnedAhead {
		a.pinnedAhead -= uint64(seg.size)
		seg.pinnedAhead = false
	}
	if p := seg.prepin; p != nil {
		seg.prepin = nil
		h, _ := a.be.(HostMemory)
		dev, size := a.device, seg.size
		go func() {
			<-p.done
			if p.err == nil {
				_ = h.FreeHost(dev, p.addr, size)
			}
		}()
	}
	a.freeBackupMemory(seg)
	seg.backupValid, seg.backupRetained = false, false
}

// freeBackupMemory frees the memory of seg's host copy, if any.
func (a *Allocator) freeBackupMemory(seg *segment) {
	if seg.backup != 0 {
		if seg.backupPinned {
			h, _ := a.be.(HostMemory)
			_ = h.FreeHost(a.device, seg.backup, seg.size)
		} else {
			_ = unix.MunmapPtr(ptrAt(seg.backup), seg.size)
		}
	}
	if seg.backupFile != nil {
		_ = seg.backupFile.Close()
	}
	seg.backup, seg.backupPinned, seg.backupFile = 0, false, nil
}

// BackupOf returns the address of the host copy of [ptr, ptr+size), which
// must lie in one segment, and whether that segment is paused. The copy is
// what the last pause saved: ErrInvalidState when there is none (the tag
// has no backup, the last pause discarded it, or it never paused).
func (a *Allocator) BackupOf(ptr, size uintptr) (uintptr, bool, error) {
	a.lock()
	defer a.mu.Unlock()
	for _, seg := range a.heap.segments {
		if ptr < seg.addr || ptr >= seg.addr+seg.size {
			continue
		}
		if size > seg.addr+seg.size-ptr {
			return 0, false, Errorf(ErrInvalidArgument, "%d bytes at %#x run past the end of their segment [%#x, %#x)", size, ptr, seg.addr, seg.addr+seg.size)
		}
		if !seg.backupValid {
			why := "its tag has no backup"
			switch {
			case seg.pools.tag.backup != BackupNone && seg.paused:
				why = "its last pause discarded the contents"
			case seg.pools.tag.backup != BackupNone:
				why = "it was never paused"
			}
			return 0, seg.paused, Errorf(ErrInvalidState, "%#x (tag %q on device %d) has no host copy: %s", ptr, seg.pools.tag.name, a.device, why)
		}
		return seg.backup + (ptr - seg.addr), seg.paused, nil
	}
	return 0, false, Errorf(ErrInvalidPointer, "%#x is not in memory of device %d's allocator", ptr, a.device)
}

// ptrAt turns an address of memory that Go does not manage into a pointer
// (without the uintptr-to-Pointer conversion that vet rejects).
func ptrAt(addr uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&addr))
}
