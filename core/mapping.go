package core

import "errors"

// Note [Create, reserve, map]
//
// Memory outside the allocator's heap (signal pads, staging buffers, slab
// chunks, peers' imported segments) is made in three steps: create physical
// memory, reserve an address range, map the one in the other. A step that
// fails undoes the earlier ones in reverse order, so the caller has nothing
// to clean up: that is CreateMapped, and MapNew for memory that already
// exists (a peer's import). UnmapRelease undoes the three once the memory
// is no longer used, and says what it leaked when a step fails. These three
// functions are the only place the sequence and its undo are written.

// CreateMapped makes size bytes of physical memory on device and maps them
// in a new reserved range (create, reserve, map). On failure nothing is
// left: what was made is released again.
func CreateMapped(be Backend, device int, size uintptr) (addr uintptr, mem Memory, err error) {
	mem, err = be.Create(device, size)
	if err != nil {
		return 0, 0, err
	}
	if addr, err = MapNew(be, device, mem, size); err != nil {
		return 0, 0, err
	}
	return addr, mem, nil
}

// MapNew maps size bytes of mem in a new reserved range of device (reserve,
// map). It takes mem over: on failure mem is released and the range given
// back.
func MapNew(be Backend, device int, mem Memory, size uintptr) (uintptr, error) {
	addr, err := be.Reserve(device, size)
	if err != nil {
		be.Release(mem)
		return 0, err
	}
	if err := be.Map(device, addr, size, mem); err != nil {
		be.Unreserve(device, addr, size)
		be.Release(mem)
		return 0, err
	}
	return addr, nil
}

// UnmapRelease undoes CreateMapped or MapNew once nothing uses the memory.
// If Unmap fails, the memory stays mapped and reserved (still valid to
// touch); once it is unmapped, a failed Release or Unreserve leaks the
// memory or the address range, and the error says so.
func UnmapRelease(be Backend, device int, addr, size uintptr, mem Memory) error {
	if err := be.Unmap(device, addr, size); err != nil {
		return Errorf(CodeOf(err), "%d bytes at %#x left mapped (leaked): %v", size, addr, err)
	}
	var errs []error
	if err := be.Release(mem); err != nil {
		errs = append(errs, Errorf(CodeOf(err), "%d bytes unmapped from %#x, but their memory could not be released (leaked): %v", size, addr, err))
	}
	if err := be.Unreserve(device, addr, size); err != nil {
		errs = append(errs, Errorf(CodeOf(err), "the address range %#x (%d bytes) could not be given back (leaked): %v", addr, size, err))
	}
	return errors.Join(errs...)
}
