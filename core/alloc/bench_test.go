package alloc_test

import (
	"testing"

	"github.com/libsymmem/libsymmem/core/alloc"
)

// benchAllocFree times alloc+free pairs of 4 KiB on a, the cached path.
func benchAllocFree(b *testing.B, a *alloc.Allocator) {
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, err := a.Alloc(4096, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p, 4096, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAllocFree4K(b *testing.B) { benchAllocFree(b, newAllocator(b, nil)) }

// BenchmarkAllocFree4KWithLive: the same among 200 live blocks of mixed
// sizes, a third of them freed (a fuller free set).
func BenchmarkAllocFree4KWithLive(b *testing.B) {
	a := newAllocator(b, nil)
	var live []uintptr
	for i := 0; i < 200; i++ {
		p, _ := a.Alloc(uintptr(512*(i%37+1)), 0)
		live = append(live, p)
	}
	for i := 0; i < len(live); i += 3 {
		_ = a.Free(live[i], 0, 0)
	}
	benchAllocFree(b, a)
}
