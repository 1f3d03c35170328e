package core

import "fmt"

// DType is the element type of a collective. The values are the C ABI's
// (enum symmem_dtype in include/symmem.h) and never change; dtypeNames is
// their table (Note [Enum tables] in enum.go).
type DType int32

const (
	Float32  DType = 0
	Float16  DType = 1
	BFloat16 DType = 2
	Int32    DType = 3
)

var dtypeNames = [...]EnumName{
	Float32:  {"SYMMEM_FLOAT32", "float32"},
	Float16:  {"SYMMEM_FLOAT16", "float16"},
	BFloat16: {"SYMMEM_BFLOAT16", "bfloat16"},
	Int32:    {"SYMMEM_INT32", "int32"},
}

// Valid says whether d is one of the types above.
func (d DType) Valid() bool { return d >= 0 && int(d) < len(dtypeNames) }

// Size is the size of one element in bytes.
func (d DType) Size() uintptr {
	if d == Float16 || d == BFloat16 {
		return 2
	}
	return 4
}

func (d DType) String() string {
	if d.Valid() {
		return dtypeNames[d].Name
	}
	return fmt.Sprintf("dtype(%d)", int32(d))
}

// ReduceOp is the reduction of all-reduce and reduce-scatter. Values are the
// C ABI's (enum symmem_op); opNames is their table.
type ReduceOp int32

const (
	OpSum ReduceOp = 0
	OpMax ReduceOp = 1
	OpMin ReduceOp = 2
)

var opNames = [...]EnumName{
	OpSum: {"SYMMEM_SUM", "sum"},
	OpMax: {"SYMMEM_MAX", "max"},
	OpMin: {"SYMMEM_MIN", "min"},
}

func (o ReduceOp) Valid() bool { return o >= 0 && int(o) < len(opNames) }

func (o ReduceOp) String() string {
	if o.Valid() {
		return opNames[o].Name
	}
	return fmt.Sprintf("op(%d)", int32(o))
}

// CollKind is which collective runs. Values are the C ABI's (enum
// symmem_coll); collNames is their table.
type CollKind int32

const (
	AllReduce     CollKind = 0
	AllGather     CollKind = 1
	ReduceScatter CollKind = 2
	// AllToAll: rank p's chunk of every input to rank p (equal splits, or
	// the split-driven forms of AllToAllV; Note [All-to-all] in
	// core/symm/coll/alltoall.go).
	AllToAll CollKind = 3
)

var collNames = [...]EnumName{
	AllReduce:     {"SYMMEM_ALL_REDUCE", "all_reduce"},
	AllGather:     {"SYMMEM_ALL_GATHER", "all_gather"},
	ReduceScatter: {"SYMMEM_REDUCE_SCATTER", "reduce_scatter"},
	AllToAll:      {"SYMMEM_ALL_TO_ALL", "all_to_all"},
}

func (k CollKind) Valid() bool { return k >= 0 && int(k) < len(collNames) }

func (k CollKind) String() string {
	if k.Valid() {
		return collNames[k].Name
	}
	return fmt.Sprintf("collective(%d)", int32(k))
}

// Algo is how all-reduce runs. Values are the C ABI's (enum symmem_algo);
// algoNames is their table. The kernels encode a resolved algorithm
// otherwise (Collective.KernelAlgo).
type Algo int32

const (
	// AlgoAuto picks by world size, size and where out is (Note [All-reduce
	// choice] in core/symm/coll).
	AlgoAuto Algo = 0
	// AlgoOneShot: every rank reads every rank's whole input and reduces.
	AlgoOneShot Algo = 1
	// AlgoTwoShot: rank r reduces slice r, then every rank's output gets
	// every reduced slice (a reduce-scatter then an all-gather, by direct
	// stores into the peers or, for large calls, by direct loads: Note
	// [Two-shot pulls] in core/symm/coll/coll.go).
	AlgoTwoShot Algo = 2
	// AlgoHierarchical, on a group that spans machines: a reduce-scatter
	// inside each machine over the mapped memory with the library's own
	// collectives, an all-reduce of each slice across machines through the
	// engine (NCCL on a communicator split by local rank), an all-gather
	// inside each machine (Note [Hierarchical all-reduce] in core/symm/coll). On
	// a group of one machine there is no level above the machine: it is
	// AlgoAuto.
	AlgoHierarchical Algo = 3
	// AlgoNCCL, on a group that spans machines: the whole collective on the
	// group's communicator (NCCL), on the registered window. On a group of
	// one machine it is AlgoAuto.
	AlgoNCCL Algo = 4
	// AlgoLowLatency: one phase, no barrier: every rank stores its
	// contribution into every peer's low-latency buffer as 16-byte lines
	// that carry the call's sequence number beside 8 bytes of data, and
	// each rank polls its own buffer until every line of the call has
	// arrived (Note [Low-latency collectives] in
	// core/symm/coll/lowlatency.go). For small calls of every collective;
	// on the host backend it runs as AlgoOneShot (same results).
	AlgoLowLatency Algo = 5
	// AlgoCopyEngine: the bytes move through the GPUs' copy engines, not
	// the SMs (Note [Copy-engine collectives] in
	// core/symm/coll/copyengine.go): all_gather and all_to_all pull every
	// peer's chunk with one copy each, ordered by stream memory operations
	// on the pads (no kernel); all_reduce and reduce_scatter pull the
	// peers' chunks into a scratch and reduce there with a small kernel.
	// On the host backend the copies are memcpy (same results).
	AlgoCopyEngine Algo = 6
)

var algoNames = [...]EnumName{
	AlgoAuto:         {"SYMMEM_ALGO_AUTO", "auto"},
	AlgoOneShot:      {"SYMMEM_ALGO_ONE_SHOT", "one_shot"},
	AlgoTwoShot:      {"SYMMEM_ALGO_TWO_SHOT", "two_shot"},
	AlgoHierarchical: {"SYMMEM_ALGO_HIERARCHICAL", "hierarchical"},
	AlgoNCCL:         {"SYMMEM_ALGO_NCCL", "nccl"},
	AlgoLowLatency:   {"SYMMEM_ALGO_LOW_LATENCY", "low_latency"},
	AlgoCopyEngine:   {"SYMMEM_ALGO_COPY_ENGINE", "copy_engine"},
}

func (a Algo) Valid() bool { return a >= 0 && int(a) < len(algoNames) }

func (a Algo) String() string {
	if a.Valid() {
		return algoNames[a].Name
	}
	return fmt.Sprintf("algo(%d)", int32(a))
}

// Collective is one checked collective call, everything a backend needs to
// run it on one rank (Note [Collectives] in core/symm/coll/coll.go).
// Addresses are this process's.
type Collective struct {
	Kind  CollKind
	DType DType
	Op    ReduceOp
	Algo  Algo // never AlgoAuto here: resolved by the caller
	// Pull, for two-shot: each rank reduces its slice into its own out and
	// then reads the peers' reduced slices, rather than storing its slice
	// into every rank's out (Note [Two-shot pulls] in core/symm/coll/coll.go).
	Pull bool
	// Count is the number of elements of each rank's input.
	Count uintptr
	Rank  int
	World int
	// Buffers and Pads are the world-long arrays of block and pad pointers
	// (device memory where the backend has it: the handle's *_ptrs_dev);
	// PadSize is the size of the users' part of a pad: the library's device
	// region starts there (Note [Pad partition]).
	Buffers, Pads uintptr
	PadSize       uintptr
	// InOffset is the input's offset in every rank's block.
	InOffset uintptr
	// Out is this rank's output; OutOffset its offset in every rank's block
	// when it lies inside the rendezvoused block (required by two-shot),
	// else -1.
	Out       uintptr
	OutOffset int64
	// SlicedInput, for all-gather: rank q's input is at InOffset + q*Count
	// elements of its block rather than at InOffset (the in-place layout
	// of an all-gather whose out lies at one offset in every block: each
	// rank's part already sits in its own out).
	SlicedInput bool
	// Channel selects the device sets of the pad's library region that the
	// call's barriers use: calls that may run at once (on different streams)
	// need different channels.
	Channel int
	// TimeoutNs bounds every wait of a kernel (Note [Pad partition]).
	TimeoutNs uint64
	// StopMirror is the pinned host word that a kernel copies this rank's
	// stop word into when it gives up or refuses to run (Note [Failed
	// collectives] in core/symm/coll/coll.go); 0: none.
	StopMirror uintptr
	// Digest is the 32-bit digest of the call's arguments that every rank
	// publishes at the opening barrier and compares with its peers' (Note
	// [Collective agreement] in core/symm/coll/coll.go).
	Digest uint32
	// LLOffset is where the low-latency buffers start in every rank's pad
	// and LLSlot the bytes of one sender's slot there (AlgoLowLatency;
	// Note [Low-latency collectives] in core/symm/coll/lowlatency.go).
	// PadAddrs holds every rank's pad address here (what Pads holds in
	// device memory), so that a kernel can take them from its parameters.
	LLOffset, LLSlot uintptr
	PadAddrs         []uintptr
	// Unchecked skips the argument agreement, for measuring its cost only
	// (SYMMEM_COLL_UNCHECKED; never for real work: ranks that disagree then
	// compute wrong numbers instead of failing).
	Unchecked bool
	// V, for AllToAll, is its split-driven form (nil: equal splits of Count
	// elements per rank).
	V *AllToAllV
	// Norm, on an all-reduce, is the residual add and RMS norm after it
	// (Note [All-reduce with RMSNorm] in core/symm/coll/norm.go): with
	// AlgoLowLatency one kernel crosses and norms; otherwise Out already
	// holds the all-reduce's result and the kernel adds and norms alone.
	Norm *RMSNorm
}

// RMSNorm is the part of an all-reduce with RMSNorm beyond the
// all-reduce: Tokens rows of Hidden elements (Count = Tokens*Hidden), this
// rank's residual (read and written) and weight (Hidden elements), of the
// call's dtype.
type RMSNorm struct {
	Tokens, Hidden   uintptr
	Residual, Weight uintptr
	Eps              float32
}

// A2ALayout is the form of a split-driven all-to-all (Note [All-to-all] in
// core/symm/coll/alltoall.go): how its splits are ordered and where the
// rows land.
type A2ALayout int32

const (
	// A2AV: one split per rank, rows packed in rank order on both sides
	// (torch's all_to_all_vdev).
	A2AV A2ALayout = 0
	// A2AV2D: the dispatch: splits per (rank, expert), rank-major; out
	// grouped by our expert, each group aligned (all_to_all_vdev_2d).
	A2AV2D A2ALayout = 1
	// A2AV2DOffset: the combine: splits and offsets per (expert, rank),
	// expert-major; out packed rank-major (all_to_all_vdev_2d_offset).
	A2AV2DOffset A2ALayout = 2
)

func (l A2ALayout) String() string {
	switch l {
	case A2AV:
		return "all_to_all_v"
	case A2AV2D:
		return "all_to_all_v_2d"
	case A2AV2DOffset:
		return "all_to_all_v_2d_offset"
	}
	return fmt.Sprintf("a2a_layout(%d)", int32(l))
}

// A2AMaxSplits is the most splits (world * experts) of one split-driven
// all-to-all: what sizes the exchange area of every pad (Note [Pad
// partition]).
const A2AMaxSplits = 1024

// AllToAllV is the split-driven part of an all-to-all call. Addresses are
// this process's (device memory on cuda).
type AllToAllV struct {
	Layout   A2ALayout
	RowBytes uintptr
	Experts  int
	// InSplits is S int64 splits (A2AV2DOffset: 2 x S, splits then row
	// offsets into the input); OutSplitsOffsets is 2 x S int64, written.
	InSplits, OutSplitsOffsets uintptr
	// InRows is how many rows the input can hold (the block from the
	// rendezvous offset), OutRows how many out can.
	InRows, OutRows uintptr
	MajorAlign      int64
	// ExchangeOffset is where the exchange area starts in every rank's pad
	// (A2AExchangeOffset).
	ExchangeOffset uintptr
}

// Splits is the number of splits, world * experts.
func (v *AllToAllV) Splits(world int) int { return world * v.Experts }

// CollectiveLauncher is implemented by backends that run collectives as
// kernels on a stream (cuda). Launch enqueues c on s and returns; nothing
// is enqueued when it fails.
type CollectiveLauncher interface {
	LaunchCollective(device int, s Stream, c *Collective) error
}

// KernelInfo says how a backend got its collectives' kernels for a device.
type KernelInfo struct {
	Arch      int     // compute capability, major*10 + minor (90 on H100/H200)
	Compiler  string  // "NVRTC 12.9 (/path/libnvrtc.so.12)"
	FromCache bool    // the image came from the disk cache
	CompileMs float64 // NVRTC's compile time (0 when from the cache)
	LoadMs    float64 // reading the cache file (if any) and cuModuleLoadData
	CachePath string  // the cache file ("" when the cache is off)
	Note      string  // why the cache was off or rebuilt, if it was
}

// KernelLoader is implemented by backends that compile and load kernels
// (cuda): LoadKernels does it for device now (once per process and
// device; later calls return the first call's info).
type KernelLoader interface {
	LoadKernels(device int) (KernelInfo, error)
}

// The kernels' encoding of a resolved algorithm (symmem_coll_params.algo in
// cuda/kernels/collectives.cu), which is also the one the argument digest
// packs (Note [Collective agreement] in core/symm/coll/coll.go). It is not the
// C API's Algo: two-shot has two kernel forms and the hierarchical and
// NCCL forms never reach a kernel.
const (
	KernelOneShot     = 1
	KernelTwoShotPush = 2
	KernelTwoShotPull = 3
	KernelLowLatency  = 4
	KernelCopyEngine  = 5 // no collective kernel: the copy engines (the digest's code only)
)

// KernelAlgoName names a kernel algorithm (KernelOneShot ...) with the
// word of its Algo: one_shot, two_shot, two_shot (pull), low_latency.
func KernelAlgoName(k uint32) string {
	switch k {
	case KernelOneShot:
		return AlgoOneShot.String()
	case KernelTwoShotPush:
		return AlgoTwoShot.String()
	case KernelTwoShotPull:
		return AlgoTwoShot.String() + " (pull)"
	case KernelLowLatency:
		return AlgoLowLatency.String()
	case KernelCopyEngine:
		return AlgoCopyEngine.String()
	}
	return fmt.Sprintf("kernel algo %d", k)
}

// KernelAlgo is c's algorithm as the kernels encode it.
func (c *Collective) KernelAlgo() uint32 {
	switch {
	case c.Algo == AlgoLowLatency:
		return KernelLowLatency
	case c.Algo == AlgoCopyEngine:
		return KernelCopyEngine
	case c.Algo == AlgoTwoShot && c.Pull:
		return KernelTwoShotPull
	case c.Algo == AlgoTwoShot:
		return KernelTwoShotPush
	}
	return KernelOneShot
}

// Copy is one copy of CopyEngineRunner.CopiesAsync: N bytes from Src to
// Dst.
type Copy struct{ Dst, Src, N uintptr }

// CopyEngineRunner is implemented by backends whose streams can move a
// collective's bytes with the GPUs' copy engines (cuda): the pieces of
// AlgoCopyEngine (Note [Copy-engine collectives] in
// core/symm/coll/copyengine.go), ordered on s with StreamMemOps.
type CopyEngineRunner interface {
	// CopiesAsync enqueues copies as one step of s and returns: each
	// moves N bytes from Src to Dst (addresses of this process: its own
	// device memory or a peer's mapped block), no kernel runs them, they
	// may run at once (on streams beside s, after the work queued on s so
	// far), and work queued on s afterwards waits for all of them.
	CopiesAsync(device int, s Stream, copies []Copy) error
	// LaunchLocalReduce enqueues on s a small kernel that writes to out the
	// reduction of count elements of dt at each of srcs, in their order,
	// as the collectives reduce (fp32 accumulation for 16-bit types,
	// rounded once; int32 sums wrap). count 0 launches nothing but still
	// gets the kernel ready (compiled, loaded), so that a caller learns
	// whether the reduction can run before it enqueues anything.
	LaunchLocalReduce(device int, s Stream, dt DType, op ReduceOp, srcs []uintptr, out, count uintptr) error
	// Capturing says whether s is being captured into a CUDA graph.
	Capturing(device int, s Stream) (bool, error)
}
