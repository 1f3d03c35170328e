package alloc

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

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
	h, ok := a.be.(core.HostMemory)
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

// pinSlots bounds the pinnings ahead in flight (each a blocking driver call
// on a thread of its own): a model of thousands of segments must not start
// thousands of threads. Four keep the kernel's page zeroing busy on several
// cores.
var pinSlots = make(chan struct{}, 4)

// pinWaitMax is the largest segment whose pause waits for its pinning
// ahead still in flight rather than copy to a pageable stand-in, where no
// more pinnings are pending than pinSlots runs at once (behind a queue the
// wait would be the queue's).
const pinWaitMax = 32 << 20

// pinsPending counts the pinnings ahead started and not yet finished.
var pinsPending atomic.Int64

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
		if h, ok := a.be.(core.HostMemory); ok {
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
		return core.Errorf(core.ErrOutOfMemory, "mmap of %d bytes of host memory: %v", seg.size, err)
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
			return core.Errorf(core.ErrInvalidArgument, "backup directory %s: %v", core.Quote(dir), err)
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
	return core.Current().Text("SYMMEM_BACKUP_DIR", os.TempDir())
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
		return core.Errorf(core.ErrInvalidState, "a disk backup in %s: %v (set the directory with symmem_set_backup_dir or SYMMEM_BACKUP_DIR)", core.Quote(dir), err)
	}
	_ = os.Remove(f.Name())
	fail := func(what string, err error) error {
		_ = f.Close()
		code := core.ErrInvalidState
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
			code = core.ErrOutOfMemory
		}
		return core.Errorf(code, "a disk backup of %d bytes in %s: %s: %v", seg.size, core.Quote(dir), what, err)
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
	b := unsafe.Slice((*byte)(unmanaged.Pointer(seg.backup)), seg.size)
	if err := unix.Msync(b, unix.MS_SYNC); err != nil {
		return core.Errorf(core.ErrInvalidState, "writing the disk backup out (msync): %v", err)
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

// pinAheadLimit is SYMMEM_BACKUP_PIN_AHEAD: the bytes per device of host
// copies pinned ahead (Note [Pinned ahead]).
func pinAheadLimit() uint64 {
	return core.Current().Size("SYMMEM_BACKUP_PIN_AHEAD", pinAheadDefault())
}

// pinAheadDefault is SYMMEM_BACKUP_PIN_AHEAD's default: a quarter of the
// host memory this process may use (core.HostMemoryLimit), shared among the
// machine's GPUs (as /proc/driver/nvidia/gpus lists them, whatever
// CUDA_VISIBLE_DEVICES shows this process), so that the processes of a
// machine, one per GPU, hold at most a quarter of it together. Unknown
// memory: no bound.
var pinAheadDefault = sync.OnceValue(func() uint64 {
	var mem uint64
	if core.HostMemoryLimit != nil {
		mem = core.HostMemoryLimit()
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
		h, _ := a.be.(core.HostMemory)
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
			h, _ := a.be.(core.HostMemory)
			_ = h.FreeHost(a.device, seg.backup, seg.size)
		} else {
			_ = unix.MunmapPtr(unmanaged.Pointer(seg.backup), seg.size)
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
			return 0, false, core.Errorf(core.ErrInvalidArgument, "%d bytes at %#x run past the end of their segment [%#x, %#x)", size, ptr, seg.addr, seg.addr+seg.size)
		}
		if !seg.backupValid {
			why := "its tag has no backup"
			switch {
			case seg.pools.tag.backup != BackupNone && seg.paused:
				why = "its last pause discarded the contents"
			case seg.pools.tag.backup != BackupNone:
				why = "it was never paused"
			}
			return 0, seg.paused, core.Errorf(core.ErrInvalidState, "%#x (tag %q on device %d) has no host copy: %s", ptr, seg.pools.tag.name, a.device, why)
		}
		return seg.backup + (ptr - seg.addr), seg.paused, nil
	}
	return 0, false, core.Errorf(core.ErrInvalidPointer, "%#x is not in memory of device %d's allocator", ptr, a.device)
}
