package coll

import (
	"encoding/binary"
	"math"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// The element conversions of the collectives, bit for bit those of
// include/symmem_device.cuh: float32 to bfloat16 and float16 round to
// nearest even (NaN stays NaN, quiet), the reverse is exact.

// BF16ToFloat widens a bfloat16.
func BF16ToFloat(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// FloatToBF16 rounds f to the nearest bfloat16, ties to even.
func FloatToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F16ToFloat widens an IEEE half.
func F16ToFloat(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0 && man == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: man * 2^-24
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// FloatToF16 rounds f to the nearest IEEE half, ties to even.
func FloatToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 31 {
		return sign | 0x7c00
	}
	if e <= 0 {
		shift := uint(14 - e)
		if shift > 24 {
			return sign
		}
		man |= 0x800000
		h := man >> shift
		rem, half := man&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || rem == half && h&1 == 1 {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++
	}
	return sign | uint16(h)
}

// LoadFloat reads one element of a floating type at addr as float32.
func LoadFloat(dt core.DType, addr uintptr) float32 {
	switch dt {
	case core.BFloat16:
		return BF16ToFloat(*(*uint16)(unmanaged.Pointer(addr)))
	case core.Float16:
		return F16ToFloat(*(*uint16)(unmanaged.Pointer(addr)))
	}
	return *(*float32)(unmanaged.Pointer(addr))
}

// PutFloat writes v into b (a Go slice of at least dt's size) as one
// element of a floating type, little-endian as the devices store it.
func PutFloat(dt core.DType, b []byte, v float32) {
	switch dt {
	case core.BFloat16:
		binary.LittleEndian.PutUint16(b, FloatToBF16(v))
	case core.Float16:
		binary.LittleEndian.PutUint16(b, FloatToF16(v))
	default:
		binary.LittleEndian.PutUint32(b, math.Float32bits(v))
	}
}

// StoreFloat writes v at addr as one element of a floating type.
func StoreFloat(dt core.DType, addr uintptr, v float32) {
	switch dt {
	case core.BFloat16:
		*(*uint16)(unmanaged.Pointer(addr)) = FloatToBF16(v)
	case core.Float16:
		*(*uint16)(unmanaged.Pointer(addr)) = FloatToF16(v)
	default:
		*(*float32)(unmanaged.Pointer(addr)) = v
	}
}

// ReduceFloat is op on two float32 values as the kernels compute it (max
// and min as fmaxf / fminf: a NaN operand yields the other one).
func ReduceFloat(op core.ReduceOp, a, b float32) float32 {
	switch op {
	case core.OpMax:
		if a != a || b > a {
			return b
		}
		return a
	case core.OpMin:
		if a != a || b < a {
			return b
		}
		return a
	}
	return a + b
}
