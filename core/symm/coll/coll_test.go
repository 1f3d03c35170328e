package coll

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
)

// The conversions against known values (include/symmem_device.cuh has the
// same ones).
func TestFloatConversions(t *testing.T) {
	for _, c := range []struct {
		f    float32
		bf16 uint16
		f16  uint16
	}{
		{0, 0, 0},
		{1, 0x3f80, 0x3c00},
		{-2, 0xc000, 0xc000},
		{65504, 0x4780, 0x7bff},
		{65520, 0x4780, 0x7c00}, // f16: rounds to infinity
		{float32(math.Inf(1)), 0x7f80, 0x7c00},
		{1.0 / (1 << 24), 0x3380, 0x0001},                  // smallest f16 subnormal
		{1.0 / (1 << 25), 0x3300, 0x0000},                  // a tie: to even (0)
		{1.5 / (1 << 24), 0x33c0, 0x0002},                  // a tie: to even (2)
		{math.Float32frombits(0x3f808000), 0x3f80, 0x3c04}, // bf16 tie to even (down)
		{math.Float32frombits(0x3f818000), 0x3f82, 0x3c0c}, // bf16 tie to even (up)
		{math.Float32frombits(0x3f801000), 0x3f80, 0x3c00}, // f16 tie to even (down)
		{math.Float32frombits(0x3f803000), 0x3f80, 0x3c02}, // f16 tie to even (up)
	} {
		if got := FloatToBF16(c.f); got != c.bf16 {
			t.Errorf("FloatToBF16(%g) = %#x, want %#x", c.f, got, c.bf16)
		}
		if got := FloatToF16(c.f); got != c.f16 {
			t.Errorf("FloatToF16(%g) = %#x, want %#x", c.f, got, c.f16)
		}
	}
	// Every half round-trips through float32 exactly.
	for h := 0; h < 1<<16; h++ {
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue // NaNs
		}
		if got := FloatToF16(F16ToFloat(uint16(h))); got != uint16(h) {
			t.Fatalf("half %#x -> %g -> %#x", h, F16ToFloat(uint16(h)), got)
		}
		if got := FloatToBF16(BF16ToFloat(uint16(h))); h&0x7f80 != 0x7f80 && got != uint16(h) {
			t.Fatalf("bfloat16 %#x -> %#x", h, got)
		}
	}
}

// Note [All-reduce choice]: what auto resolves to by world, size and where
// out is.
func TestCollAutoAllReduce(t *testing.T) {
	big, small := OneShotMaxBytes+16, OneShotMaxBytes
	require.Less(t, OneShotMaxBytes, TwoShotPullMinBytes, "two-shot pushes between the two, where it measured faster")
	require.Less(t, OneShotInPlaceMaxBytes2, TwoShotPullMinBytes)
	cases := []struct {
		world               int
		n                   uintptr
		inPlace, outInBlock bool
		want                core.Algo
	}{
		{2, small, true, true, core.AlgoOneShot},
		{2, big, false, true, core.AlgoOneShot},
		{2, big, false, false, core.AlgoOneShot},
		{2, 256 << 20, false, true, core.AlgoOneShot},
		{2, big, true, true, core.AlgoOneShot},
		{2, OneShotInPlaceMaxBytes2, true, true, core.AlgoOneShot},
		{2, OneShotInPlaceMaxBytes2 + 16, true, true, core.AlgoTwoShot},
		{2, OneShotInPlaceMaxBytes2 + 16, true, false, core.AlgoOneShot},
		{4, small, false, true, core.AlgoOneShot},
		{4, big, false, true, core.AlgoTwoShot},
		{4, big, true, true, core.AlgoTwoShot},
		{4, big, false, false, core.AlgoOneShot},
		{8, big, true, true, core.AlgoTwoShot},
	}
	for _, c := range cases {
		require.Equal(t, c.want, autoAllReduce(c.world, c.n, c.inPlace, c.outInBlock), "%+v", c)
	}
}
