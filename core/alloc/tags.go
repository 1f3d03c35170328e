package alloc

import (
	"sort"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/lockrank"
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

// tagInfo is what the process knows of a tag, whatever the device.
type tagInfo struct {
	name string
	TagOptions
}

// TagOptions are the properties of a tag, the same for every region of it.
type TagOptions struct {
	// Backup says where a pause keeps a host copy of the tag's memory.
	Backup BackupKind
	// OwnDevice maps the tag's segments for their own device alone (Note
	// [Own-device tags]).
	OwnDevice bool
}

// Note [Own-device tags]
//
// A segment is mapped with read-write access for its device and, by
// default, for every other GPU that can reach it directly, so that a copy
// between GPUs in one process (PyTorch runs them as kernels reading the
// peer's memory) works on libsymmem's memory as on cudaMalloc's. Each
// granted peer costs page tables on that peer, built at every map: on an
// H200, mapping 4 GiB takes 0.8 ms for its own device and 21 ms with one
// peer (bench/pause_bench.py's driver floor), and a tag that is paused and
// resumed pays it at every resume. A tag registered with OwnDevice maps its
// segments for their device alone (core.OwnDeviceMapper), as
// torch_memory_saver and vLLM's CuMemAllocator map theirs: the drop-ins'
// tags are such tags, so their resumes cost what the originals' do, and a
// program written for those originals never relied on peer access to that
// memory. Peers in other processes are unaffected: an importer grants
// access to its own device when it maps a peer's segment.

// tagRegistry numbers tags process-wide. Tags are never forgotten: an ID
// stays valid for the life of the process (there are few tags).
var tagRegistry = struct {
	lockrank.Mutex[lockrank.TagRegistry]
	byName map[string]TagID
	info   []tagInfo // info[id]; info[0] is the untagged memory
}{byName: map[string]TagID{}, info: []tagInfo{{}}}

// RegisterTag returns the ID of tag name, making it on first use. backup
// (where a host copy is kept across a pause) is a property of the tag:
// every region of a tag must ask for the same.
func RegisterTag(name string, backup BackupKind) (TagID, error) {
	return RegisterTagWith(name, TagOptions{Backup: backup})
}

// RegisterTagWith is RegisterTag with every property of the tag.
func RegisterTagWith(name string, o TagOptions) (TagID, error) {
	backup := o.Backup
	if backup > BackupDisk {
		return 0, core.Errorf(core.ErrInvalidArgument, "tag %q: unknown backup kind %d", name, uint8(backup))
	}
	if err := core.CheckName("tag", name, MaxTagLen); err != nil {
		return 0, err
	}
	r := &tagRegistry
	r.Lock()
	defer r.Unlock()
	if id, ok := r.byName[name]; ok {
		if r.info[id].Backup != backup {
			return 0, core.Errorf(core.ErrInvalidArgument, "tag %q was opened with backup %v before; every region of a tag must ask for the same backup", name, r.info[id].Backup)
		}
		if r.info[id].OwnDevice != o.OwnDevice {
			return 0, core.Errorf(core.ErrInvalidArgument, "tag %q was opened with own-device mapping %v before; every region of a tag must ask for the same", name, r.info[id].OwnDevice)
		}
		return id, nil
	}
	id := TagID(len(r.info))
	r.info = append(r.info, tagInfo{name: name, TagOptions: o})
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
	if err := core.CheckName("tag", name, MaxTagLen); err != nil {
		return 0, err
	}
	return 0, core.Errorf(core.ErrInvalidArgument, "tag %q is unknown: no region of it was opened", name)
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
// tag can be allocated. A pause that fails in its release step leaves the
// tag paused, whatever it released (Note [Releasing a paused tag]), so
// that Resume takes back what it did release.
type tagState struct {
	id        TagID
	name      string
	backup    BackupKind
	ownDevice bool // Note [Own-device tags]
	paused    bool
}

// tagLocked returns the state of tag id here, making it at first use.
func (a *Allocator) tagLocked(id TagID) (*tagState, error) {
	if int(id) < len(a.tags) && a.tags[id] != nil {
		return a.tags[id], nil
	}
	info, ok := tagInfoOf(id)
	if !ok || id == 0 {
		return nil, core.Errorf(core.ErrInvalidArgument, "tag number %d is not registered", id)
	}
	for int(id) >= len(a.tags) {
		a.tags = append(a.tags, nil)
	}
	t := &tagState{id: id, name: info.name, backup: info.Backup, ownDevice: info.OwnDevice}
	a.tags[id] = t
	return t, nil
}

// mapSegment maps memory for a segment of tag t (nil: untagged) at addr:
// for its device alone where the tag asks (Note [Own-device tags]) and the
// backend can, else as the backend's Map grants.
func (a *Allocator) mapSegment(t *tagState, addr, size uintptr, m core.Memory) error {
	if t != nil && t.ownDevice {
		if om, ok := a.be.(core.OwnDeviceMapper); ok {
			return om.MapOwnDevice(a.device, addr, size, m)
		}
	}
	return a.be.Map(a.device, addr, size, m)
}

// info describes seg for peers and callers.
func (seg *segment) info() SegmentInfo {
	return SegmentInfo{ID: seg.id, Addr: seg.addr, Size: seg.size, HeapOff: seg.heapOff, Tag: seg.pools.tag.name, Paused: seg.paused}
}

// TagChoice is what a pause or a resume acts on: one tag that a region
// registered, or (the empty name) every tag. ChooseTag resolves the name
// once; the allocators then find the tag by its ID.
type TagChoice struct {
	name string
	id   TagID // 0 for every tag
}

// ChooseTag resolves name ("" = every tag): a malformed or unknown name is
// KnownTag's error.
func ChooseTag(name string) (TagChoice, error) {
	if name == "" {
		return TagChoice{}, nil
	}
	id, err := KnownTag(name)
	if err != nil {
		return TagChoice{}, err
	}
	return TagChoice{name: name, id: id}, nil
}

// Name is the tag's name ("" for every tag).
func (c TagChoice) Name() string { return c.name }

// Every says whether c is every tag.
func (c TagChoice) Every() bool { return c.name == "" }

// selectTags returns the states here of what c names: every tag this
// device has seen, or the one tag (made at first use: a tag registered in
// the process but never used on this device has nothing here to pause).
// a.mu held.
func (a *Allocator) selectTags(c TagChoice) ([]*tagState, error) {
	if c.Every() {
		var out []*tagState
		for _, t := range a.tags[1:] {
			if t != nil {
				out = append(out, t)
			}
		}
		return out, nil
	}
	t, err := a.tagLocked(c.id)
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

// TagSegments lists the segments of tag ("" = every tag used here) in heap
// order, checking that every selected tag is paused (wantPaused) or live.
func (a *Allocator) TagSegments(tag string, wantPaused bool) ([]SegmentInfo, error) {
	c, err := ChooseTag(tag)
	if err != nil {
		return nil, err
	}
	return a.ChosenSegments(c, wantPaused)
}

// ChosenSegments is TagSegments of a tag already resolved.
func (a *Allocator) ChosenSegments(c TagChoice, wantPaused bool) ([]SegmentInfo, error) {
	a.lock()
	defer a.mu.Unlock()
	tags, err := a.tagsToChange(c, wantPaused)
	if err != nil {
		return nil, err
	}
	var out []SegmentInfo
	for _, seg := range a.segmentsOf(tags) {
		out = append(out, seg.info())
	}
	return out, nil
}

// checkTagState says whether t is paused (wantPaused) or live; a paused
// tag that a failed pause left in part mapped says so (a.mu held).
func (a *Allocator) checkTagState(t *tagState, wantPaused bool) error {
	switch {
	case wantPaused && !t.paused:
		return core.Errorf(core.ErrInvalidState, "tag %q on device %d is not paused: nothing to resume", t.name, a.device)
	case !wantPaused && t.paused:
		mapped := 0
		for _, seg := range a.segmentsOf([]*tagState{t}) {
			if !seg.paused {
				mapped++
			}
		}
		if mapped > 0 {
			return core.Errorf(core.ErrInvalidState, "tag %q on device %d is already paused, in part: a pause that failed while releasing left %d of its segments mapped; resume it (which takes back the rest), then pause it again", t.name, a.device, mapped)
		}
		return core.Errorf(core.ErrInvalidState, "tag %q on device %d is already paused", t.name, a.device)
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
// (paused true) of c acts on: the named one, which must be in that state,
// or every tag used on this device that is (a.mu held).
func (a *Allocator) tagsToChange(c TagChoice, paused bool) ([]*tagState, error) {
	tags, err := a.selectTags(c)
	if err != nil {
		return nil, err
	}
	if !c.Every() {
		if err := a.checkTagState(tags[0], paused); err != nil {
			return nil, err
		}
	}
	return filterTags(tags, paused), nil
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
