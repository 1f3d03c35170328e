package core

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var updateEnums = flag.Bool("update", false, "write python/symmem/_enums.py from the enum tables (go generate ./core)")

const (
	headerPath  = "../include/symmem.h"
	pyEnumsPath = "../python/symmem/_enums.py"
)

// headerEnum is one enum of include/symmem.h as written there.
type headerEnum struct {
	name   string           // "symmem_dtype"
	values map[int32]string // value -> C name
}

// headerEnums reads every enum of the C header src. It fails on an enum it
// cannot read (an enumerator without an explicit value, an enum that is not
// a typedef'd "typedef enum name { ... } name;"), so that none is skipped.
func headerEnums(t *testing.T, src string) []headerEnum {
	t.Helper()
	text := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(src, "")
	text = regexp.MustCompile(`//[^\n]*`).ReplaceAllString(text, "")
	blocks := regexp.MustCompile(`(?s)typedef\s+enum\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;`).FindAllStringSubmatch(text, -1)
	require.Len(t, blocks, len(regexp.MustCompile(`\benum\b`).FindAllString(text, -1)),
		"every enum of the header is read: each is written as typedef enum name { ... } name;")
	item := regexp.MustCompile(`^(SYMMEM_\w+)\s*=\s*(\d+)$`)
	var out []headerEnum
	for _, b := range blocks {
		require.Equal(t, b[1], b[3], "typedef enum %s { ... } %s: one name", b[1], b[3])
		e := headerEnum{name: b[1], values: map[int32]string{}}
		for _, it := range strings.Split(b[2], ",") {
			it = strings.TrimSpace(it)
			if it == "" {
				continue
			}
			m := item.FindStringSubmatch(it)
			require.NotNil(t, m, "enum %s: %q is not NAME = value (the header fixes every value)", e.name, it)
			v, err := strconv.ParseInt(m[2], 10, 32)
			require.NoError(t, err)
			_, dup := e.values[int32(v)]
			require.False(t, dup, "enum %s: value %d twice", e.name, v)
			e.values[int32(v)] = m[1]
		}
		out = append(out, e)
	}
	return out
}

// TestEnumsAgree checks every enum of include/symmem.h against Go's tables
// and Python's (Note [Enum tables] in enum.go): the same enums, and in each
// the same values with the same C names, both ways; every Go name set and
// unique; python/symmem/_enums.py what the tables write. With -update (go
// generate ./core) it writes _enums.py first.
func TestEnumsAgree(t *testing.T) {
	src, err := os.ReadFile(headerPath)
	require.NoError(t, err)
	header := headerEnums(t, string(src))
	require.NotEmpty(t, header)

	goEnums := map[string]Enum{}
	for _, e := range Enums() {
		goEnums[e.C] = e
	}
	var headerNames []string
	for _, h := range header {
		headerNames = append(headerNames, h.name)
		g, ok := goEnums[h.name]
		require.Truef(t, ok, "include/symmem.h declares enum %s, which has no table in core (Note [Enum tables])", h.name)
		got := map[int32]string{}
		names := map[string]bool{}
		for v, n := range g.Values {
			got[int32(v)] = n.C
			require.NotEmptyf(t, n.Name, "%s: value %d (%s) has no Go name", h.name, v, n.C)
			require.Falsef(t, names[n.Name], "%s: Go name %q twice", h.name, n.Name)
			names[n.Name] = true
		}
		require.Equalf(t, h.values, got, "enum %s: include/symmem.h (expected) against its Go table (actual), value -> C name", h.name)
	}
	var goNames []string
	for _, e := range Enums() {
		goNames = append(goNames, e.C)
	}
	require.ElementsMatch(t, headerNames, goNames, "the header's enums against core.Enums()")

	want := pythonEnums()
	if *updateEnums {
		require.NoError(t, os.WriteFile(pyEnumsPath, []byte(want), 0o644))
	}
	py, err := os.ReadFile(pyEnumsPath)
	require.NoError(t, err)
	require.Equal(t, want, string(py), "python/symmem/_enums.py is not what core's enum tables write: go generate ./core")
}

// pythonEnums is python/symmem/_enums.py, written from the tables.
func pythonEnums() string {
	var b strings.Builder
	b.WriteString(`# Written from core's enum tables by ` + "`go generate ./core`" + `; TestEnumsAgree
# (core/enum_test.go) checks that it is, and checks the tables against
# include/symmem.h (Note [Enum tables] in core/enum.go). Do not edit by hand.
"""The enums of include/symmem.h, with the names Python uses for them."""

import enum


class Result(enum.IntEnum):
    """` + "``enum symmem_result``" + `; the values are fixed by the C ABI."""

`)
	for v, n := range codeNames {
		fmt.Fprintf(&b, "    %s = %d\n", strings.TrimPrefix(strings.TrimPrefix(n.C, "SYMMEM_"), "ERROR_"), v)
	}
	dict := func(comment, name string, table []EnumName) {
		fmt.Fprintf(&b, "\n#: %s\n%s = {", comment, name)
		for v, n := range table {
			if v > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%q: %d", n.Name, v)
		}
		b.WriteString("}\n")
	}
	b.WriteString("\n")
	dict("``enum symmem_dtype`` by name.", "DTYPES", dtypeNames[:])
	b.WriteString("\n#: The size in bytes of an element of each dtype, by value.\nDTYPE_SIZES = {")
	for v := range dtypeNames {
		if v > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d: %d", v, DType(v).Size())
	}
	b.WriteString("}\n")
	dict("``enum symmem_op`` by name.", "OPS", opNames[:])
	dict("``enum symmem_coll`` by name.", "COLLECTIVES", collNames[:])
	dict("``enum symmem_algo`` by name.", "ALGOS", algoNames[:])
	return b.String()
}

// The error texts that refuse an unknown value list the tables.
func TestEnumKnownLists(t *testing.T) {
	require.Equal(t, "0 float32, 1 float16, 2 bfloat16, 3 int32", Known[DType]())
	require.Equal(t, "0 sum, 1 max, 2 min", Known[ReduceOp]())
	require.Equal(t, "0 all_reduce, 1 all_gather, 2 reduce_scatter, 3 all_to_all", Known[CollKind]())
	require.Equal(t, "0 auto, 1 one_shot, 2 two_shot, 3 hierarchical, 4 nccl, 5 low_latency, 6 copy_engine", Known[Algo]())
	require.Equal(t, "two_shot (pull)", KernelAlgoName(KernelTwoShotPull))
	require.Equal(t, "kernel algo 7", KernelAlgoName(7))
}
