package main

// The collectives' section of include/symmem.h (all-reduce, all-gather,
// reduce-scatter, all-to-all, the all-reduce with RMSNorm): marshalling
// only; the logic is in core/symm/coll.

/*
#include "internal.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/symm/coll"
)

func collective(call string, handle uintptr, a coll.Args) C.int {
	h, err := handleOf(handle)
	if err == nil {
		err = coll.Run(h, a)
	}
	if err == nil {
		return 0
	}
	return setLastError(fmt.Sprintf("%s(dtype=%d, op=%d, count=%d, algo=%d, channel=%d)", call, int32(a.DType), int32(a.Op), uint64(a.Count), int32(a.Algo), a.Channel), err)
}

//export symmemgo_all_reduce
func symmemgo_all_reduce(handle uintptr, dtype, op C.int, count C.size_t, out unsafe.Pointer, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_all_reduce", &result, C.int(core.ErrInternal))
	return collective("symmem_all_reduce", handle, coll.Args{Kind: core.AllReduce, DType: core.DType(dtype), Op: core.ReduceOp(op),
		Count: uintptr(count), Out: uintptr(out), Stream: streamOf(stream)})
}

//export symmemgo_all_gather
func symmemgo_all_gather(handle uintptr, dtype C.int, count C.size_t, out unsafe.Pointer, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_all_gather", &result, C.int(core.ErrInternal))
	return collective("symmem_all_gather", handle, coll.Args{Kind: core.AllGather, DType: core.DType(dtype),
		Count: uintptr(count), Out: uintptr(out), Stream: streamOf(stream)})
}

//export symmemgo_reduce_scatter
func symmemgo_reduce_scatter(handle uintptr, dtype, op C.int, count C.size_t, out unsafe.Pointer, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_reduce_scatter", &result, C.int(core.ErrInternal))
	return collective("symmem_reduce_scatter", handle, coll.Args{Kind: core.ReduceScatter, DType: core.DType(dtype), Op: core.ReduceOp(op),
		Count: uintptr(count), Out: uintptr(out), Stream: streamOf(stream)})
}

//export symmemgo_collective
func symmemgo_collective(handle uintptr, kind, dtype, op C.int, count C.size_t, out unsafe.Pointer, algo, channel C.int, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_collective", &result, C.int(core.ErrInternal))
	return collective("symmem_collective", handle, coll.Args{Kind: core.CollKind(kind), DType: core.DType(dtype), Op: core.ReduceOp(op),
		Algo: core.Algo(algo), Count: uintptr(count), Out: uintptr(out), Channel: int(channel), Stream: streamOf(stream)})
}

//export symmemgo_collective_from
func symmemgo_collective_from(handle uintptr, kind, dtype, op C.int, count C.size_t, in, out unsafe.Pointer, algo, channel C.int, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_collective_from", &result, C.int(core.ErrInternal))
	return collective("symmem_collective_from", handle, coll.Args{Kind: core.CollKind(kind), DType: core.DType(dtype), Op: core.ReduceOp(op),
		Algo: core.Algo(algo), Count: uintptr(count), In: uintptr(in), Out: uintptr(out), Channel: int(channel), Stream: streamOf(stream)})
}

//export symmemgo_low_latency_max_bytes
func symmemgo_low_latency_max_bytes(handle uintptr) (result C.size_t) {
	defer recoverCall("symmem_low_latency_max_bytes", &result, 0)
	h, err := handleOf(handle)
	if err != nil {
		setLastError("symmem_low_latency_max_bytes", err)
		return 0
	}
	return C.size_t(coll.LowLatencyBytes(h))
}

//export symmemgo_all_to_all
func symmemgo_all_to_all(handle uintptr, dtype C.int, count C.size_t, out unsafe.Pointer, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_all_to_all", &result, C.int(core.ErrInternal))
	return collective("symmem_all_to_all", handle, coll.Args{Kind: core.AllToAll, DType: core.DType(dtype),
		Count: uintptr(count), Out: uintptr(out), Stream: streamOf(stream)})
}

//export symmemgo_all_reduce_rmsnorm
func symmemgo_all_reduce_rmsnorm(handle uintptr, dtype C.int, tokens, hidden C.size_t, residual, weight unsafe.Pointer, eps C.float,
	out unsafe.Pointer, algo C.int, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_all_reduce_rmsnorm", &result, C.int(core.ErrInternal))
	return rmsnorm("symmem_all_reduce_rmsnorm", handle, coll.NormArgs{DType: core.DType(dtype), Algo: core.Algo(algo), Tokens: uintptr(tokens),
		Hidden: uintptr(hidden), Residual: uintptr(residual), Weight: uintptr(weight), Eps: float32(eps), Out: uintptr(out),
		Stream: streamOf(stream)})
}

//export symmemgo_all_reduce_rmsnorm_from
func symmemgo_all_reduce_rmsnorm_from(handle uintptr, dtype C.int, tokens, hidden C.size_t, in, residual, weight unsafe.Pointer, eps C.float,
	out unsafe.Pointer, algo C.int, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_all_reduce_rmsnorm_from", &result, C.int(core.ErrInternal))
	return rmsnorm("symmem_all_reduce_rmsnorm_from", handle, coll.NormArgs{DType: core.DType(dtype), Algo: core.Algo(algo), Tokens: uintptr(tokens),
		Hidden: uintptr(hidden), In: uintptr(in), Residual: uintptr(residual), Weight: uintptr(weight), Eps: float32(eps), Out: uintptr(out),
		Stream: streamOf(stream)})
}

func rmsnorm(call string, handle uintptr, a coll.NormArgs) C.int {
	h, err := handleOf(handle)
	if err == nil {
		err = coll.RunRMSNorm(h, a)
	}
	if err == nil {
		return 0
	}
	return setLastError(fmt.Sprintf("%s(dtype=%d, tokens=%d, hidden=%d, algo=%d)", call, int32(a.DType), uint64(a.Tokens), uint64(a.Hidden), int32(a.Algo)), err)
}

// allToAllV runs a split-driven all-to-all (Note [All-to-all] in
// core/symm/coll).
func allToAllV(call string, handle uintptr, out unsafe.Pointer, v coll.A2AArgs, stream *C.struct_CUstream_st) C.int {
	h, err := handleOf(handle)
	if err == nil {
		err = coll.Run(h, coll.Args{Kind: core.AllToAll, Out: uintptr(out), V: &v, Stream: streamOf(stream)})
	}
	if err == nil {
		return 0
	}
	return setLastError(fmt.Sprintf("%s(row_bytes=%d, experts=%d, out_rows=%d)", call, uint64(v.RowBytes), v.Experts, uint64(v.OutRows)), err)
}

//export symmemgo_all_to_all_v
func symmemgo_all_to_all_v(handle uintptr, rowBytes C.size_t, inSplits unsafe.Pointer, out unsafe.Pointer, outRows C.size_t,
	outSplitsOffsets unsafe.Pointer, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_all_to_all_v", &result, C.int(core.ErrInternal))
	return allToAllV("symmem_all_to_all_v", handle, out, coll.A2AArgs{Layout: core.A2AV, RowBytes: uintptr(rowBytes), Experts: 1,
		InSplits: uintptr(inSplits), OutRows: uintptr(outRows), OutSplitsOffsets: uintptr(outSplitsOffsets)}, stream)
}

//export symmemgo_all_to_all_v_2d
func symmemgo_all_to_all_v_2d(handle uintptr, rowBytes C.size_t, experts C.int, inSplits unsafe.Pointer, out unsafe.Pointer, outRows C.size_t,
	outSplitsOffsets unsafe.Pointer, majorAlign C.int64_t, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_all_to_all_v_2d", &result, C.int(core.ErrInternal))
	return allToAllV("symmem_all_to_all_v_2d", handle, out, coll.A2AArgs{Layout: core.A2AV2D, RowBytes: uintptr(rowBytes), Experts: int(experts),
		InSplits: uintptr(inSplits), OutRows: uintptr(outRows), OutSplitsOffsets: uintptr(outSplitsOffsets), MajorAlign: int64(majorAlign)}, stream)
}

//export symmemgo_all_to_all_v_2d_offset
func symmemgo_all_to_all_v_2d_offset(handle uintptr, rowBytes C.size_t, experts C.int, inSplitsOffsets unsafe.Pointer, out unsafe.Pointer,
	outRows C.size_t, outSplitsOffsets unsafe.Pointer, stream *C.struct_CUstream_st) (result C.int) {
	defer recoverCall("symmem_all_to_all_v_2d_offset", &result, C.int(core.ErrInternal))
	return allToAllV("symmem_all_to_all_v_2d_offset", handle, out, coll.A2AArgs{Layout: core.A2AV2DOffset, RowBytes: uintptr(rowBytes),
		Experts: int(experts), InSplits: uintptr(inSplitsOffsets), OutRows: uintptr(outRows), OutSplitsOffsets: uintptr(outSplitsOffsets)}, stream)
}
