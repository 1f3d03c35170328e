// Package ranktest runs multi-process tests: the test binary re-executes
// itself once per rank (selecting a helper test by name), every rank prints
// one result line with Report, and Run collects the results.
package ranktest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/libsymmem/libsymmem/core"
)

const resultPrefix = "SYMMEM_RANK_RESULT "

// Result is what one rank process reported. Code is -1 when the process
// printed no result (it crashed or was killed); Exit is its exit status.
type Result struct {
	Rank int    `json:"rank"`
	Code int    `json:"code"`
	Msg  string `json:"msg"`
	Exit int    `json:"-"`
	Out  string `json:"-"`
}

// Spec is one rank process: its rank, the variables added to the parent's
// environment, and optionally other credentials or another binary (default:
// this test binary).
type Spec struct {
	Rank int
	Env  []string
	Cred *syscall.Credential
	Bin  string
}

// Run starts one process per spec, each running only the test named helper,
// and waits for all of them.
func Run(t testing.TB, helper string, specs []Spec) []Result {
	t.Helper()
	type proc struct {
		cmd  *exec.Cmd
		out  *bytes.Buffer
		rank int
	}
	var procs []proc
	for _, s := range specs {
		bin := s.Bin
		if bin == "" {
			bin = os.Args[0]
		}
		cmd := exec.Command(bin, "-test.run=^"+helper+"$", "-test.timeout=300s")
		// GORACE: the race runtime otherwise sleeps 1 s at exit.
		cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), s.Env...)
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if s.Cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.Cred}
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start rank %d: %v", s.Rank, err)
		}
		procs = append(procs, proc{cmd, out, s.Rank})
	}
	res := make([]Result, 0, len(procs))
	for _, p := range procs {
		err := p.cmd.Wait()
		r := Result{Rank: p.rank, Code: -1, Out: p.out.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			r.Exit = ee.ExitCode()
		}
		sc := bufio.NewScanner(strings.NewReader(r.Out))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), resultPrefix); ok {
				if err := json.Unmarshal([]byte(line), &r); err != nil {
					t.Fatalf("rank %d: bad result line %q: %v", p.rank, line, err)
				}
			}
		}
		res = append(res, r)
	}
	return res
}

// Report prints rank's result (err's code and message) for Run to find.
func Report(rank int, err error) {
	r := Result{Rank: rank, Code: int(core.CodeOf(err))}
	if err != nil {
		r.Msg = err.Error()
	}
	b, _ := json.Marshal(r)
	fmt.Printf("\n%s%s\n", resultPrefix, b)
}

// SockDir is a socket directory for one test, removed when it ends. Its path
// is short: a Unix socket's path holds at most 107 bytes.
func SockDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return filepath.Join(d, "s")
}

// EnvInt is the integer value of an environment variable (0 if unset).
func EnvInt(name string) int {
	v, _ := strconv.Atoi(os.Getenv(name))
	return v
}
