package main

/*
#include "internal.h"
#include "tcache.h"
*/
import "C"

import (
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
)

// threadCacheOn turns the thread caches of symmem_alloc/symmem_free on
// (Note [Thread caches in C], tcache.h): the C fronts make bins only once
// this is set, at load.
var threadCacheOn = func() bool {
	on := core.Current().Bool("SYMMEM_THREAD_CACHE", true)
	if on {
		C.symmemi_tc_on = 1
	}
	return on
}()

// cBin is a thread's bin as the core sees it (alloc.ThreadCache): the C
// struct itself, read and written in place under its spinlock.
type cBin C.symmemi_tcache

// binOf is tc as a alloc.ThreadCache; nil (not a typed nil) when tc is NULL.
func binOf(tc *C.symmemi_tcache) alloc.ThreadCache {
	if tc == nil {
		return nil
	}
	return (*cBin)(tc)
}

func (b *cBin) lockWord() *int32 { return (*int32)(unsafe.Pointer(&b.lock)) }

func (b *cBin) Lock() {
	for !atomic.CompareAndSwapInt32(b.lockWord(), 0, 1) {
		runtime.Gosched() // the owner holds it for a few instructions
	}
}

func (b *cBin) Unlock() { atomic.StoreInt32(b.lockWord(), 0) }

func (b *cBin) entries() []C.symmemi_tc_entry {
	return unsafe.Slice(&b.e[0], C.SYMMEMI_TC_CAP)
}

func (b *cBin) Len() int { return int(b.len) }
func (b *cBin) Cap() int { return C.SYMMEMI_TC_CAP }

func (b *cBin) Entry(i int) alloc.CacheEntry {
	e := &b.entries()[i]
	return alloc.CacheEntry{Addr: uintptr(e.addr), Size: uintptr(e.size), Stream: core.Stream(e.stream),
		Out: e.out != 0, Requested: uintptr(e.requested)}
}

func (b *cBin) Remove(i int) {
	es := b.entries()
	n := int(b.len)
	copy(es[i:n-1], es[i+1:n])
	es[n-1] = C.symmemi_tc_entry{}
	b.len--
}

func (b *cBin) Push(e alloc.CacheEntry) {
	b.entries()[b.len] = C.symmemi_tc_entry{addr: C.uintptr_t(e.Addr), size: C.uintptr_t(e.Size), stream: C.uintptr_t(e.Stream)}
	b.len++
}

func (b *cBin) TakePending() alloc.CachePending {
	var p alloc.CachePending
	if b.hits[alloc.PendingCount][0] == 0 {
		return p // nothing since the last take: every count is 0
	}
	for q := range alloc.NumPending {
		for pool := range 3 {
			p.Hits[q][pool] = int64(b.hits[q][pool])
			p.Net[q][pool] = int64(b.net[q][pool])
			p.High[q][pool] = int64(b.high[q][pool])
			b.hits[q][pool], b.net[q][pool], b.high[q][pool] = 0, 0, 0
		}
	}
	return p
}

func (b *cBin) Dead() bool { return b.state == C.SYMMEMI_TC_DEAD }
func (b *cBin) Register()  { b.registered = 1 }

func (b *cBin) Retire() {
	b.registered = 0
	if b.state == C.SYMMEMI_TC_DEAD {
		b.state = C.SYMMEMI_TC_FREE
	}
}

// The C front's size limit (tcache.h) is the core's: this does not compile
// when they differ.
var _ = [1]struct{}{}[alloc.MaxCachedBlock-C.SYMMEMI_TC_MAX_BLOCK]
