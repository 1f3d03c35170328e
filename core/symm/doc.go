// Package symm is symmetric memory across processes: groups of ranks,
// rendezvous on buffers of the caching allocator, and signal pads. It is
// what the "Symmetric memory" section of include/symmem.h does; the export
// package only marshals.
//
// Note [What a rendezvous costs]
//
// A rendezvous always costs one all-gather of a small record (a few hundred
// bytes) through the group's exchange. Everything else is cached: each rank
// keeps the peers' segments it has mapped, keyed by (peer, segment heap
// offset) and tagged with the segment's creation number (SegmentInfo.ID, never
// reused by an allocator), and puts in its record, for every peer, the ID of
// that peer's segment it holds at the rendezvous' segment offset. Heap offsets
// are validated equal on every rank, so that offset names the same segment
// slot everywhere. From the gathered records every rank computes the same set
// of (receiver, sender) pairs that still need a descriptor; only if the set is
// not empty (or the signal pads were never exchanged) do the ranks run a
// descriptor exchange over the socket channel, then map, then all-gather a
// status so that they all succeed or all fail together.
//
// Note [Why every verdict is shared]
//
// A collective must never succeed on some ranks and fail on others: a rank
// that returns a handle would go on to signal peers that gave up. So local
// failures (a pointer that is not ours, a pad that cannot be made) are put in
// the record instead of returned early, and every rank derives the same
// verdict from the same gathered records; failures after the descriptor
// exchange (an import or map that fails) are shared by a second all-gather,
// and every rank undoes what that rendezvous mapped.
//
// Note [Lifetimes]
//
// A group's memory (its signal pads, its peers' mapped segments, the small
// pointer arrays of its handles: Note [Owners of the group's memory]) lives
// in a groupMem that the group and each of its handles hold a reference to: destroying the group closes its
// channel but leaves the memory to the handles, and the memory goes when the
// last of them goes. Each peer mapping is further counted by the handles
// that use it and is unmapped when none does (a rendezvous pins the mappings
// its record claims, so that a concurrent release cannot unmap one the peers
// were told we hold).
package symm
