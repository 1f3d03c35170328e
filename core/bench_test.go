package core_test

import "testing"

func BenchmarkAllocFree4K(b *testing.B) {
	a := newAllocator(b, nil)
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
