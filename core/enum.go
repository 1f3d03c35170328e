package core

import (
	"fmt"
	"strings"
)

//go:generate go test -run TestEnumsAgree -update

// Note [Enum tables]
// ~~~~~~~~~~~~~~~~~~
// include/symmem.h, written by hand, is the contract: it declares five
// enums (symmem_result, symmem_dtype, symmem_op, symmem_coll,
// symmem_algo) with fixed values. Go has one table per enum, indexed by
// value, next to its type: codeNames (result.go), dtypeNames, opNames,
// collNames and algoNames (collective.go). An entry holds the value's C
// name and the word Go prints for it (String, symmem_strerror for a result,
// the "known: ..." lists of the error texts, Known below).
//
// Python does not spell the values again: python/symmem/_enums.py is
// written from these tables (`go generate ./core`), and the rest of the
// package takes Result, DTYPES, OPS, COLLECTIVES and ALGOS from it. Its dict
// keys are Go's words ("bfloat16", "low_latency"); Result's members are the
// C names without SYMMEM_ and ERROR_ (INVALID_ARGUMENT).
//
// TestEnumsAgree (enum_test.go) reads every enum of the header and checks
// it against the tables, value and C name, both ways (nothing in the header
// missing here, nothing here missing from the header), and checks that
// _enums.py is what the tables write. So a new value is added in three
// steps: the header, the Go constant with its table entry, `go generate
// ./core`; the test fails until all three agree.
//
// The kernels' encoding of a resolved algorithm is not symmem_algo: it is
// Collective.KernelAlgo (collective.go), the one function that both
// cuda/kernels.go and the argument digest of core/symm/coll use.

// EnumName names one value of an enum of include/symmem.h (Note [Enum
// tables]).
type EnumName struct {
	C    string // as the header spells it: "SYMMEM_BFLOAT16"
	Name string // as Go prints it: "bfloat16"
}

// Enum is one enum of include/symmem.h: its C name and its table.
type Enum struct {
	C      string     // "symmem_dtype"
	Values []EnumName // indexed by value
}

// Enums is every enum of include/symmem.h with its Go table (Note [Enum
// tables]). The tables are copies.
func Enums() []Enum {
	return []Enum{
		{"symmem_result", append([]EnumName(nil), codeNames[:]...)},
		{"symmem_dtype", append([]EnumName(nil), dtypeNames[:]...)},
		{"symmem_op", append([]EnumName(nil), opNames[:]...)},
		{"symmem_coll", append([]EnumName(nil), collNames[:]...)},
		{"symmem_algo", append([]EnumName(nil), algoNames[:]...)},
	}
}

// known lists a table for a message: "0 float32, 1 float16, 2 bfloat16,
// 3 int32".
func known(table []EnumName) string {
	parts := make([]string, len(table))
	for v, n := range table {
		parts[v] = fmt.Sprintf("%d %s", v, n.Name)
	}
	return strings.Join(parts, ", ")
}

// Known lists the values of a DType, ReduceOp, CollKind or Algo with their
// names, for a message that refuses an unknown one:
// "0 float32, 1 float16, 2 bfloat16, 3 int32".
func Known[T DType | ReduceOp | CollKind | Algo]() string {
	var zero T
	switch any(zero).(type) {
	case DType:
		return known(dtypeNames[:])
	case ReduceOp:
		return known(opNames[:])
	case CollKind:
		return known(collNames[:])
	default: // Algo, the constraint's last
		return known(algoNames[:])
	}
}
