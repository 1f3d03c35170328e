package main

import (
	"os"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/libsymmem/libsymmem/core"
	"github.com/stretchr/testify/require"
)

// TestEveryPublicFunctionHasAFront checks Note [The C front]: every function
// of include/symmem.h is a C front (SYMMEM_FRONT in export/*.c, or written by
// hand: starting with SYMMEMI_REFUSE_IN_CHILD and calling its Go export) or
// plain C that never enters Go (errors.c, torch_shim.cc); every front is in
// the header; every Go export is a symmemgo_ function with a front and a
// guard.
func TestEveryPublicFunctionHasAFront(t *testing.T) {
	read := func(path string) string {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return string(b)
	}
	names := func(re *regexp.Regexp, text string) map[string]bool {
		out := map[string]bool{}
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			out[m[1]] = true
		}
		return out
	}
	header := names(regexp.MustCompile(`(?m)^[a-z][^;()]*?\b(symmem_[a-z0-9_]+)\(`), read("../include/symmem.h"))
	require.Greater(t, len(header), 40, "the header's functions were not found")

	cFiles := filesEnding(".c")
	fronts := map[string]bool{}
	frontRe := regexp.MustCompile(`SYMMEM_FRONT\(\s*[^,]+,\s*([a-z0-9_]+),|SYMMEM_FRONT_VOID\(\s*([a-z0-9_]+),`)
	// A front by hand: a definition of symmem_NAME whose body starts with
	// the fork check and runs to the first "}" at the start of a line.
	byHandRe := regexp.MustCompile(`(?ms)^[a-z_][^;{}]*?\bsymmem_([a-z0-9_]+)\(([^;{)]*)\)\s*\{\n(.*?)\n\}`)
	byHand := 0
	for _, f := range cFiles {
		text := read(f)
		for _, m := range frontRe.FindAllStringSubmatch(text, -1) {
			fronts["symmem_"+m[1]+m[2]] = true
		}
		for _, m := range byHandRe.FindAllStringSubmatch(text, -1) {
			name, body := m[1], m[3]
			if f == "errors.c" {
				continue // plain C, never enters Go (pureC below)
			}
			require.Regexpf(t, `^\s*SYMMEMI_REFUSE_IN_CHILD\(`+name+`\b`, body, "%s: symmem_%s is written by hand, so its first statement must be SYMMEMI_REFUSE_IN_CHILD(%s, ...)", f, name, name)
			require.Containsf(t, body, "symmemgo_"+name+"(", "%s: symmem_%s must call symmemgo_%s", f, name, name)
			require.Falsef(t, fronts["symmem_"+name], "symmem_%s has two fronts", name)
			fronts["symmem_"+name] = true
			byHand++
		}
	}
	require.Equal(t, 2, byHand, "symmem_alloc and symmem_free are the fronts written by hand (tcache.c)")
	pureC := names(regexp.MustCompile(`(?m)^[a-z][^;()]*?\b(symmem_[a-z0-9_]+)\([^;]*\{`), read("errors.c")+read("torch_shim.cc"))
	for name := range header {
		require.Truef(t, fronts[name] || pureC[name], "%s is declared in include/symmem.h but has no SYMMEM_FRONT in export/*.c", name)
	}
	for name := range fronts {
		require.Truef(t, header[name], "front %s is not declared in include/symmem.h", name)
	}

	goFiles := filesEnding(".go")
	exportRe := regexp.MustCompile(`(?m)^//export (\S+)\nfunc (\S+)\([^{]*\{\n(.*)\n`)
	var exported []string
	for _, f := range goFiles {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		for _, m := range exportRe.FindAllStringSubmatch(read(f), -1) {
			exported = append(exported, m[1])
			require.Truef(t, strings.HasPrefix(m[1], "symmemgo_"), "%s: Go exports are named symmemgo_NAME and reached through the C front symmem_NAME", m[1])
			require.Truef(t, fronts["symmem_"+strings.TrimPrefix(m[1], "symmemgo_")], "%s has no SYMMEM_FRONT", m[1])
			require.Regexpf(t, `^\tdefer recover(Call|Void)\("symmem_`+regexp.QuoteMeta(strings.TrimPrefix(m[1], "symmemgo_"))+`"`, m[3],
				"%s must start with its guard (Note [The guard])", m[1])
		}
	}
	sort.Strings(exported)
	require.Equal(t, len(fronts), len(exported), "every front calls a Go export and every Go export has a front: %v", exported)
}

// filesEnding lists the files of this folder whose names end with suffix.
func filesEnding(suffix string) []string {
	entries, _ := os.ReadDir(".")
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), suffix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// panicky stands for an exported function whose body panics.
func panicky(how string) (result int32) {
	defer recoverCall("symmem_test", &result, int32(core.ErrInternal))
	switch how {
	case "nil":
		var m map[string]int
		m["x"] = 1
	case "index":
		var s []int
		_ = s[len(how)]
	}
	return 0
}

func panickyVoid() {
	defer recoverVoid("symmem_test_void")
	panic("deliberate")
}

// TestGuardTurnsPanicsIntoInternalErrors: a panic becomes the failure value
// and SYMMEM_ERROR_INTERNAL with the panic's text and place as last error.
func TestGuardTurnsPanicsIntoInternalErrors(t *testing.T) {
	runtime.LockOSThread() // the last error is per OS thread
	defer runtime.UnlockOSThread()
	require.Equal(t, int32(0), panicky(""), "no panic: the function's own result")
	for _, how := range []string{"nil", "index"} {
		require.Equal(t, int32(core.ErrInternal), panicky(how))
		code, msg := lastError()
		require.Equal(t, core.ErrInternal, code)
		require.Contains(t, msg, "symmem_test: internal error, please report it: Go panic in github.com/libsymmem/libsymmem/export.panicky (front_test.go:")
	}
	_, msg := lastError()
	require.Contains(t, msg, "index out of range")
	panickyVoid()
	code, msg := lastError()
	require.Equal(t, core.ErrInternal, code)
	require.Contains(t, msg, "symmem_test_void: internal error, please report it: Go panic in github.com/libsymmem/libsymmem/export.panickyVoid")
	require.Contains(t, msg, "deliberate")
}
