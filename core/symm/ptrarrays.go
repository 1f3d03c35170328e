package symm

import (
	"errors"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/lockrank"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"golang.org/x/sys/unix"
)

// pointerArrays is the table of the handles' C-visible pointer arrays (Note
// [Owners of the group's memory]): the slabs their slots come from and the
// filled arrays that handles share (Note [Shared pointer arrays]). Its lock
// alone guards its fields, the slabs' and every ptrArrays' refs.
type pointerArrays struct {
	ops *memOps
	mu  lockrank.Mutex[lockrank.PointerArrays]
	// host holds the C-visible pointer arrays of handles; dev their device
	// copies (nil on the host backend, where the host arrays serve both).
	host *slab
	dev  *slab
	// byContent are the live pointer arrays by content (Note [Shared
	// pointer arrays]); every entry has refs > 0.
	byContent map[string]*ptrArrays
}

// ptrArrays is a pair of filled pointer-array slots (host, device) that
// handles with the same pointers share; refs counts them (the table's).
type ptrArrays struct {
	key       string
	host, dev uintptr
	// teamHost, teamDev: the team view's arrays (0 on one machine).
	teamHost, teamDev uintptr
	refs              int
}

// Note [Pointer arrays in the pad]
//
// Kernels read a handle's pointer arrays from device memory, which comes in
// granules (2 MiB on H200) while a group's arrays take 16 bytes per rank
// per handle. Each group made its own granule for them (cuMemCreate,
// reserve, map, access for every peer GPU): 0.7 to 5.6 ms of group creation
// on 2 H200. The pad is a granule too, of which the pad and the library's
// region use 64 KiB and a few KiB: the device slab is seeded with the rest
// of this rank's pad, so a group's arrays need no memory of their own
// until its handles' arrays outgrow the pad's spare end (more than ~60,000
// live handles at 2 ranks). Peers map our whole pad but only ever touch its
// first padSize + core.DeviceRegionBytes bytes. The pad then lives as long as
// the slab: both go with the group's memory (dropPadsLocked), and a slab
// tainted by a timed-out copy leaks the pad with it.

// seedDevice makes the device slab for handles' pointer arrays, unless
// there is one, seeded with the spare end of this rank's pad p, and takes a
// slot from it so that a rank that cannot have one fails group creation.
func (t *pointerArrays) seedDevice(p *pads) error {
	o := t.ops
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dev != nil {
		return nil
	}
	t.dev = newDeviceSlab(o.be, o.device, o.gran, uintptr(2*o.world*8))
	used := roundUp(o.padUsed(p.size), 256)
	if used < p.phys {
		t.dev.seed(p.addr[o.rank]+used, p.phys-used)
	}
	a, err := t.dev.alloc()
	if err != nil {
		return err
	}
	t.dev.release(a)
	return nil
}

// take takes a host slot and, where the backend's kernels need it, a
// device slot (else the host one again) for world-long pointer arrays.
func (t *pointerArrays) take(world int) (host, dev uintptr, err error) {
	o := t.ops
	t.mu.Lock()
	defer t.mu.Unlock()
	slot := uintptr(2 * world * 8)
	if t.host == nil {
		t.host = newHostSlab(slot)
	}
	a, err := t.host.alloc()
	if err != nil {
		return 0, 0, err
	}
	if !o.be.Capabilities().DevicePointerArrays {
		return a, a, nil
	}
	if t.dev == nil {
		t.dev = newDeviceSlab(o.be, o.device, o.gran, slot)
	}
	d, err := t.dev.alloc()
	if err != nil {
		t.host.release(a)
		return 0, 0, err
	}
	return a, d, nil
}

// give gives back slots that take took.
func (t *pointerArrays) give(host, dev uintptr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.giveLocked(host, dev)
}

func (t *pointerArrays) giveLocked(host, dev uintptr) {
	if t.host != nil && host != 0 {
		t.host.release(host)
	}
	if t.dev != nil && dev != host && dev != 0 {
		t.dev.release(dev)
	}
}

// share takes a reference to the filled arrays of content key (nil: none).
func (t *pointerArrays) share(key []byte) *ptrArrays {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.byContent[string(key)]
	if a != nil {
		a.refs++
	}
	return a
}

// publish makes a, filled, with one reference, the arrays of its content.
func (t *pointerArrays) publish(a *ptrArrays) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byContent == nil {
		t.byContent = map[string]*ptrArrays{}
	}
	a.refs = 1
	t.byContent[a.key] = a
}

// unshare drops a reference to a; the last one gives back its slots.
func (t *pointerArrays) unshare(a *ptrArrays) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if a.refs--; a.refs > 0 {
		return
	}
	delete(t.byContent, a.key)
	t.giveLocked(a.host, a.dev)
	t.giveLocked(a.teamHost, a.teamDev)
}

// copyArrays copies world-long filled host arrays to their device slot
// (nothing where they are one). A copy that timed out may still land: the
// device slab is tainted (never unmapped).
func (t *pointerArrays) copyArrays(dev, host uintptr, world int) error {
	if dev == host {
		return nil
	}
	if err := t.ops.copyOut(dev, host, uintptr(2*world*8)); err != nil {
		if core.CodeOf(err) == core.ErrTimeout {
			t.mu.Lock()
			t.dev.tainted = true
			t.mu.Unlock()
		}
		return err
	}
	return nil
}

// closeDevice gives back the device slab (leaked if tainted) and forgets
// it; padTainted says that its slots in this rank's pad may still be
// written, so the pad must be leaked too (Note [Pointer arrays in the
// pad]). The device is synchronised or unused.
func (t *pointerArrays) closeDevice() (padTainted bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dev == nil {
		return false, nil
	}
	padTainted = t.dev.tainted && t.dev.seeded
	err = t.dev.close()
	t.dev = nil
	return padTainted, err
}

// forgetDevice drops the device slab without giving it back (what a failed
// synchronisation left mapped stays so, leaked).
func (t *pointerArrays) forgetDevice() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dev = nil
}

// closeHost gives back the host slab; the device is synchronised.
func (t *pointerArrays) closeHost() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.host == nil {
		return nil
	}
	err := t.host.close()
	t.host = nil
	return err
}

// slab hands out fixed-size slots of memory that Go does not manage, so that
// C may keep pointers to them (the handles' pointer arrays).
type slab struct {
	slot   uintptr
	chunk  uintptr
	get    func(size uintptr) (uintptr, error)
	put    func(addr, size uintptr) error
	chunks []uintptr
	free   []uintptr
	// seeded: slots were also carved from memory the slab does not own
	// (seed: the spare end of the group's pad), which close leaves alone.
	seeded bool
	// tainted: a copy into a slot timed out and may still land, so the
	// chunks are never unmapped (close leaks them, and says so; the owner
	// of seeded memory must leak it too).
	tainted bool
}

func newHostSlab(slot uintptr) *slab {
	return &slab{
		slot:  slot,
		chunk: roundUp(max(slot, 64<<10), uintptr(unix.Getpagesize())),
		get: func(size uintptr) (uintptr, error) {
			p, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				return 0, core.Errorf(core.ErrOutOfMemory, "mmap of %d bytes for handle pointer arrays: %v", size, err)
			}
			return uintptr(p), nil
		},
		put: func(addr, size uintptr) error { return unix.MunmapPtr(unmanaged.Pointer(addr), size) },
	}
}

// newDeviceSlab takes its chunks from the backend (device memory on cuda).
func newDeviceSlab(be core.Backend, device int, gran, slot uintptr) *slab {
	mems := map[uintptr]core.Memory{}
	return &slab{
		slot:  slot,
		chunk: roundUp(slot, gran),
		get: func(size uintptr) (uintptr, error) {
			addr, m, err := core.CreateMapped(be, device, size)
			if err != nil {
				return 0, err
			}
			mems[addr] = m
			return addr, nil
		},
		put: func(addr, size uintptr) error {
			m := mems[addr]
			delete(mems, addr)
			return core.UnmapRelease(be, device, addr, size, m)
		},
	}
}

func (s *slab) alloc() (uintptr, error) {
	if len(s.free) == 0 {
		c, err := s.get(s.chunk)
		if err != nil {
			return 0, err
		}
		s.chunks = append(s.chunks, c)
		for a := c; a+s.slot <= c+s.chunk; a += s.slot {
			s.free = append(s.free, a)
		}
	}
	a := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	return a, nil
}

func (s *slab) release(a uintptr) { s.free = append(s.free, a) }

// seed adds the whole slots of [addr, addr+size), memory that someone else
// owns and that must outlive the slab (close does not give it back).
func (s *slab) seed(addr, size uintptr) {
	for a := addr; a+s.slot <= addr+size; a += s.slot {
		s.free = append(s.free, a)
		s.seeded = true
	}
}

func (s *slab) close() error {
	if s.tainted {
		n := len(s.chunks)
		s.chunks, s.free = nil, nil
		if n == 0 { // only seeded slots: their owner leaks them and says so
			return nil
		}
		return core.Errorf(core.ErrTimeout, "%d chunk(s) of pointer arrays left mapped (deliberately leaked): a copy into them timed out and may still run", n)
	}
	var errs []error
	for _, c := range s.chunks {
		errs = append(errs, s.put(c, s.chunk))
	}
	s.chunks, s.free = nil, nil
	return errors.Join(errs...)
}
